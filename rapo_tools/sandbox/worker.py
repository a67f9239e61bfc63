"""The warm worker: a long-lived interpreter inside the sandbox that forks once per execution.

This file is a self-contained program (standard library only). The host runs it as
``python -I -c <REPL_FUNCTION_SOURCE + this file> <settings JSON>`` inside bubblewrap or a
Docker container (see `worker_source`). It imports the preloaded modules once, then
serves requests over its stdin/stdout with length-prefixed JSON frames:

- on start it sends ``{"ready": true, "preloaded": [...], "failed": {...}}``;
- each request ``{"code", "timeout_s", "max_output_bytes"}`` runs in a fresh fork
  (new session, rlimits, cwd = scratch), so no state survives a call;
- the reply is ``{"stdout", "stderr", "exit_code", "timed_out", "truncated"}``.

After every call, before replying, it kills whatever the code left running and empties
the scratch directories; if it cannot, its reply says ``"worker_retiring": true`` and it
exits, and the host starts a fresh worker.

Example:
    >>> import json, subprocess, sys
    >>> settings = {"preload": ["math"], "scratch_dirs": [], "own_pid_namespace": False, "limits": {}}
    >>> request = encode_frame({"code": "print(math.pi > 3)\\nimport math; math.factorial(5)",
    ...                         "timeout_s": 10, "max_output_bytes": 1000})
    >>> out = subprocess.run([sys.executable, "-I", "-c", worker_source(), json.dumps(settings)],
    ...                      input=request, capture_output=True).stdout
    >>> [message.get("ready") or message["stderr"].splitlines()[-1] for message in decode_frames(out)]
    [True, "NameError: name 'math' is not defined"]
"""

import json
import os
import resource
import select
import signal
import struct
import sys
import time

FRAME_HEADER = struct.Struct(">I")
_MAX_FRAME = 64 * 1024 * 1024
_CLEANUP_WAIT_S = 2.0


def encode_frame(message):
    """One protocol frame: a 4-byte big-endian length, then the JSON text."""
    body = json.dumps(message).encode("utf-8")
    return FRAME_HEADER.pack(len(body)) + body


def decode_frames(data):
    """Split a byte string of whole frames back into messages."""
    messages, offset = [], 0
    while offset + FRAME_HEADER.size <= len(data):
        (length,) = FRAME_HEADER.unpack_from(data, offset)
        offset += FRAME_HEADER.size
        messages.append(json.loads(data[offset:offset + length]))
        offset += length
    return messages


def worker_source():
    """The full program the sandbox interpreter runs: the REPL function plus this file."""
    from rapo_tools.sandbox.repl import REPL_FUNCTION_SOURCE

    with open(__file__, encoding="utf-8") as handle:
        return REPL_FUNCTION_SOURCE + "\n" + handle.read()


def _read_exact(fd, size):
    chunks, missing = [], size
    while missing:
        chunk = os.read(fd, missing)
        if not chunk:
            return None
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


def _receive(fd):
    header = _read_exact(fd, FRAME_HEADER.size)
    if header is None:
        return None
    (length,) = FRAME_HEADER.unpack(header)
    if length > _MAX_FRAME:
        raise ValueError(f"request frame of {length} bytes is too large")
    body = _read_exact(fd, length)
    return None if body is None else json.loads(body)


def _send(fd, message):
    data = encode_frame(message)
    while data:
        data = data[os.write(fd, data):]


def _preload(names):
    import importlib

    loaded, failed = [], {}
    for name in names:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as error:  # a missing optional module must not stop the worker
            failed[name] = f"{type(error).__name__}: {error}"
    return loaded, failed


def _warm_up(code):
    if code:
        try:
            exec(compile(code, "<warmup>", "exec"), {"__name__": "__warmup__"})
        except Exception:  # warming is an optimisation only
            pass


def _address_space_bytes():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[0]) * resource.getpagesize()


def _set_limits(limits):
    names = {
        "cpu_s": resource.RLIMIT_CPU,
        "max_processes": resource.RLIMIT_NPROC,
        "max_file_bytes": resource.RLIMIT_FSIZE,
        "max_open_files": resource.RLIMIT_NOFILE,
    }
    for key, which in names.items():
        if limits.get(key) is not None:
            value = int(limits[key])
            # CPU: the hard limit one second later turns SIGXCPU into SIGKILL for code that catches it.
            resource.setrlimit(which, (value, value + 1 if key == "cpu_s" else value))
    if limits.get("memory_bytes") is not None:
        # The budget is on top of what the warm worker already maps (numpy, sympy, ...).
        total = _address_space_bytes() + int(limits["memory_bytes"])
        resource.setrlimit(resource.RLIMIT_AS, (total, total))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _child(code, out_w, err_w, settings):
    """Runs in the forked child: never returns."""
    status = 70
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 1 << 16)  # the protocol pipes stay out of the code's reach
        if settings["scratch_dirs"]:
            os.chdir(settings["scratch_dirs"][0])
        _set_limits(settings["limits"])
        namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        status = _rapo_run(code, namespace)  # noqa: F821 - defined by REPL_FUNCTION_SOURCE
    except BaseException:  # the sandbox plumbing failed; report it like a crash
        status = 70
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(status if isinstance(status, int) and 0 <= status < 256 else 1)


def _collect(pid, fds, timeout_s, cap):
    """Read the child's stdout/stderr until it exits, the output cap or the deadline."""
    buffers = {fd: bytearray() for fd in fds}
    open_fds = set(fds)
    poller = select.poll()
    for fd in fds:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    pidfd = os.pidfd_open(pid)
    poller.register(pidfd, select.POLLIN)
    deadline = time.monotonic() + timeout_s
    exited = timed_out = truncated = False
    try:
        while not (exited or truncated):  # the code may close its output and keep working
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for fd, _ in poller.poll(remaining * 1000):
                if fd == pidfd:
                    exited = True  # data the child wrote is already in the pipes: drain below
                elif fd in open_fds:
                    truncated |= _drain(fd, buffers[fd], cap, open_fds, poller)
        if exited and not truncated:
            for fd in list(open_fds):
                truncated |= _drain(fd, buffers[fd], cap, open_fds, poller)
    finally:
        os.close(pidfd)
    return buffers, timed_out, truncated


def _drain(fd, buffer, cap, open_fds, poller):
    """Read what is available now; returns True when the cap was passed."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return False
        if not chunk:
            open_fds.discard(fd)
            poller.unregister(fd)
            return False
        buffer += chunk
        if len(buffer) > cap:
            del buffer[cap:]
            return True


def _execute(request, settings):
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        pid = os.fork()
    except OSError as error:
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        return {"stdout": "", "stderr": f"the sandbox could not start the code: {error}",
                "exit_code": 1, "timed_out": False, "truncated": False}
    if pid == 0:
        _child(request["code"], out_w, err_w, settings)
    os.close(out_w)
    os.close(err_w)
    try:
        buffers, timed_out, truncated = _collect(
            pid, (out_r, err_r), float(request["timeout_s"]), int(request["max_output_bytes"])
        )
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)  # its session, even when it exited: leftovers go too
        except (ProcessLookupError, PermissionError):
            pass
        _, wait_status = os.waitpid(pid, 0)
        os.close(out_r)
        os.close(err_r)
    exit_code = os.waitstatus_to_exitcode(wait_status)
    if truncated and exit_code == -signal.SIGKILL:
        # Killed by us for flooding: a clean stderr means the code itself had not failed.
        exit_code = 1 if buffers[err_r] else 0
    return {
        "stdout": buffers[out_r].decode("utf-8", "replace"),
        "stderr": buffers[err_r].decode("utf-8", "replace"),
        "exit_code": exit_code,
        "timed_out": timed_out,
        "truncated": truncated,
    }


def _other_processes():
    me = os.getpid()
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) not in (1, me)]


def _kill_leftovers():
    """In our own pid namespace, kill everything but init and us; True when all are gone."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        return True  # nothing was left running: the common, fast case
    deadline = time.monotonic() + _CLEANUP_WAIT_S
    while _other_processes():
        if time.monotonic() > deadline:
            return False
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        time.sleep(0.005)
    return True


def _empty_directory(path, keep=()):
    """Remove everything below ``path`` but its top-level entries named in ``keep`` (read-only mounts of
    the interpreter), however deep or locked (walking with chdir: no long paths)."""
    os.chdir(path)
    descended = []
    while True:
        subdirectory = None
        for entry in os.scandir("."):
            if not descended and entry.name in keep:
                continue
            if entry.is_dir(follow_symlinks=False):
                subdirectory = entry.name
            else:
                os.unlink(entry.name)
        if subdirectory is not None:
            os.chmod(subdirectory, 0o700)  # the code may have locked its own directories
            os.chdir(subdirectory)
            descended.append(subdirectory)
        elif descended:
            os.chdir("..")
            os.rmdir(descended.pop())
        else:
            break
    os.chdir("/")


def _clean_up(settings):
    if settings["own_pid_namespace"] and not _kill_leftovers():
        return False
    try:
        for path in settings["scratch_dirs"]:
            _empty_directory(path, settings.get("scratch_keep", {}).get(path, ()))
    except OSError:
        return False  # the worker exits; the host starts a fresh one with fresh scratch space
    return True


def _drop_privileges(target):
    uid, gid = target
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise RuntimeError("could not drop privileges")


def _make_undumpable():
    # Code running as the same uid cannot then ptrace us or open /proc/<worker>/fd.
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def main():
    settings = json.loads(sys.argv[1])
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # a module that prints on import cannot corrupt the protocol
    if settings.get("drop_to"):
        _drop_privileges(settings["drop_to"])
    loaded, failed = _preload(settings["preload"])
    _warm_up(settings.get("warmup", ""))
    _make_undumpable()
    sys.stdout.flush()
    sys.stderr.flush()
    if not _clean_up(settings):
        sys.exit("the scratch directories could not be emptied")
    _send(proto_out, {"ready": True, "preloaded": loaded, "failed": failed})
    while True:
        request = _receive(proto_in)
        if request is None:
            return
        reply = _execute(request, settings)
        # Clean before replying, so that a worker that cannot go on retires with this reply.
        reply["worker_retiring"] = not _clean_up(settings)
        _send(proto_out, reply)
        if reply["worker_retiring"]:
            sys.exit("leftover processes or files could not be removed")


if __name__ == "__main__":
    main()
