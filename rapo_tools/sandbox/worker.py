"""The warm worker: a long-lived interpreter inside the sandbox whose pristine template forks once per execution.

This file is a self-contained program (standard library only). The host runs it as
``python -I -c <REPL_FUNCTION_SOURCE + this file> <settings JSON>`` inside bubblewrap or a
Docker container (see `worker_source`). It imports the preloaded modules once, then
serves requests over its stdin/stdout with length-prefixed JSON frames. Before anything
else, as its settings say, it caps its scratch tmpfs' inodes (a remount, while it may), installs
the seccomp filter of `rapo_tools.sandbox.seccomp` on itself (every call's fork inherits it) and
drops to its unprivileged uid. The frames:

- on start it sends ``{"ready": true, "preloaded": [...], "failed": {...}}``;
- each request ``{"code", "timeout_s", "max_output_bytes", "calls_waiting"}`` runs in a
  fresh fork (new session, rlimits, cwd = scratch), so no state survives a call;
- the reply is ``{"stdout", "stderr", "exit_code", "timed_out", "truncated"}``;
- after each reply it sends ``{"ready": true}`` once it can take the next request, or
  ``{"worker_retiring": true}`` and exits without reading another request (the host
  then starts a fresh worker; a request it already sent was never run).

No call is forked from a process that held another call's data. Once warm, the worker forks a
*template*, a copy of itself that only ever forks: the worker (the *server*) reads the requests and the
children's output, and asks the template for each child over a socketpair; the template forks it and
hands the server its ends of the child's pipes (SCM_RIGHTS), and later its wait status. Each child gets
its code through its own pipe, after the fork, so neither the template nor any later child ever holds an
earlier call's code or output, not even in freed memory. Before each fork the template checks that its
rlimits and scheduling are as they were at start (the seccomp filter stops the code from changing them;
this is the second line): if not, it says so and the worker retires.

Two things keep the per-call path short. The reply goes out as soon as the child reports
its exit status through a pipe: only then does the worker reap the child (the kernel's
teardown of a large address space takes milliseconds), kill whatever the code left
running and empty the scratch directories, while the host already handles the reply.
And when the worker would otherwise idle, it forks the next child ahead of its request:
the child waits in its own session, under its rlimits, with its output pipes, blocked
on reading its code. Forking ahead costs CPU (the worker's own work then copies pages
that it shares with the waiting child), so a worker whose pool has calls waiting
(``calls_waiting``), or whose next request is already there, forks on request instead.

Example:
    >>> import json, subprocess, sys
    >>> settings = {"preload": ["math"], "scratch_dirs": [], "own_pid_namespace": False, "limits": {}}
    >>> request = encode_frame({"code": "print(math.pi > 3)\\nimport math; math.factorial(5)",
    ...                         "timeout_s": 10, "max_output_bytes": 1000})
    >>> out = subprocess.run([sys.executable, "-I", "-c", worker_source(), json.dumps(settings)],
    ...                      input=request, capture_output=True).stdout
    >>> [message.get("ready") or message["stderr"].splitlines()[-1] for message in decode_frames(out)]
    [True, "NameError: name 'math' is not defined", True]
"""

import array
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import time

FRAME_HEADER = struct.Struct(">I")
_MAX_FRAME = 64 * 1024 * 1024
_CLEANUP_WAIT_S = 2.0
_STATUS_FD = 3  # in the child: where it reports its exit status before it exits
_READ_SIZE = 65536  # per read of a pipe: below malloc's mmap threshold, so no mmap/munmap per read
_RECORD = struct.Struct("=cqq")  # template -> server: kind, pid, value
_ALL_RLIMITS = sorted({getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_")})


def encode_frame(message):
    """One protocol frame: a 4-byte big-endian length, then the JSON text."""
    body = json.dumps(message).encode("utf-8")
    return FRAME_HEADER.pack(len(body)) + body


_READY_FRAME = encode_frame({"ready": True})  # sent after every call's clean-up


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


def _write_all(fd, data):
    """Write all of ``data`` to a blocking ``fd``."""
    while data:
        data = data[os.write(fd, data):]


def _send(fd, message):
    _write_all(fd, encode_frame(message))


def _read_to_end(fd):
    """Everything ``fd`` gives until its writer closes it."""
    chunks = []
    while chunk := os.read(fd, _READ_SIZE):
        chunks.append(chunk)
    return b"".join(chunks)


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
    fd = os.open("/proc/self/statm", os.O_RDONLY)  # raw: a text file object costs a fresh fork ~100 page faults
    try:
        return int(os.read(fd, 256).split()[0]) * resource.getpagesize()
    finally:
        os.close(fd)


def rlimit_table(limits):
    """The fixed ``(resource, (soft, hard))`` pairs of a call's ``limits``, worked out once per worker so that
    each fork only applies them (all a fork does runs on every call's critical path)."""
    names = {
        "cpu_s": resource.RLIMIT_CPU,
        "max_processes": resource.RLIMIT_NPROC,
        "max_file_bytes": resource.RLIMIT_FSIZE,
        "max_open_files": resource.RLIMIT_NOFILE,
    }
    table = []
    for key, which in names.items():
        if limits.get(key) is not None:
            value = int(limits[key])
            # CPU: the hard limit one second later turns SIGXCPU into SIGKILL for code that catches it.
            table.append((which, (value, value + 1 if key == "cpu_s" else value)))
    table.append((resource.RLIMIT_CORE, (0, 0)))
    return tuple(table)


def _set_limits(table, memory_bytes):
    """Apply `rlimit_table`'s pairs, and the address-space budget ``memory_bytes`` (None: no limit)."""
    for which, pair in table:
        resource.setrlimit(which, pair)
    if memory_bytes is not None:
        # The budget is on top of what the warm worker already maps (numpy, sympy, ...).
        total = _address_space_bytes() + int(memory_bytes)
        resource.setrlimit(resource.RLIMIT_AS, (total, total))


class _Child:
    """A forked child waiting for its code, and the worker's ends of its pipes."""

    def __init__(self, pid, code_w, out_r, err_r, status_r):
        self.pid = pid
        self.code_w = code_w
        self.out_r = out_r
        self.err_r = err_r
        self.status_r = status_r


# A throwaway snippet a fresh fork runs while it would otherwise idle, waiting for its code (output
# to /dev/null, names discarded). Its writes copy, ahead of time, the pages that every call writes
# (allocator pools, interpreter state, the parse-compile-run-print path): a trivial call then runs
# in about half the time. A fork whose code is already there skips it: it would only add work.
_PAGE_TOUCH_SNIPPET = "_touched = [str(i) for i in range(8)]\nprint(len(_touched))\n"


def _touch_pages():
    """Run `_PAGE_TOUCH_SNIPPET` in a namespace of its own (the fork's stdout is still /dev/null)."""
    _rapo_run(_PAGE_TOUCH_SNIPPET, {"__name__": "__touch__", "__builtins__": __builtins__})  # noqa: F821
    sys.stdout.flush()
    sys.stderr.flush()


def _child(settings, pipes, ahead):
    """Runs in the forked child: sets up, waits for its code, runs it, reports its status; never returns."""
    code_r, out_w, err_w, status_w = pipes
    status = 70
    stage = "prepare the call"
    try:
        signal.set_wakeup_fd(-1)  # the template's: its fd is closed below, and the number may be reused
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        os.dup2(code_r, 0)
        if ahead and not _readable(0):
            _touch_pages()  # only while it would wait for its code anyway
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.dup2(status_w, _STATUS_FD)
        os.closerange(_STATUS_FD + 1, 1 << 16)  # the protocol pipes stay out of the code's reach
        if settings["scratch_dirs"]:
            os.chdir(settings["scratch_dirs"][0])
        _set_limits(settings["rlimits"], settings["limits"].get("memory_bytes"))
        code = _read_to_end(0).decode("utf-8", "surrogatepass")  # blocks until the request comes
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.close(null)
        namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        stage = "parse the code"  # _rapo_run reports what goes wrong later (and SyntaxError) itself
        status = _rapo_run(code, namespace)  # noqa: F821 - defined by REPL_FUNCTION_SOURCE
    except BaseException as error:  # e.g. RecursionError or MemoryError from the parser: say so
        status = 1
        report_failure(stage, error)
    status = status if isinstance(status, int) and 0 <= status < 256 else 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    try:
        os.write(_STATUS_FD, bytes([status]))  # the output is complete: the worker may reply now
    except BaseException:
        pass  # the code closed the status pipe: the worker waits for the exit instead
    os._exit(status)


def report_failure(stage, error):
    """Tell the code's stderr why the sandbox could not do ``stage`` (the message the model sees)."""
    detail = str(error) or ("the parser ran out of memory: is the code nested too deeply?"
                            if isinstance(error, MemoryError) else "no detail")
    message = f"the sandbox could not {stage}: {type(error).__name__} ({detail})\n"
    try:
        os.write(2, message.encode("utf-8", "replace"))
    except BaseException:
        pass  # the code closed its stderr; its exit status still tells


def _fork_child(settings, ahead):
    """Fork the child of a call, ``ahead`` of its request or for one at hand (in the template); returns it,
    or the OSError that stopped the fork."""
    code_r, code_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        pid = os.fork()
    except OSError as error:
        for fd in (code_r, code_w, out_r, out_w, err_r, err_w, status_r, status_w):
            os.close(fd)
        return error
    if pid == 0:
        _child(settings, (code_r, out_w, err_w, status_w), ahead)
    for fd in (code_r, out_w, err_w, status_w):
        os.close(fd)
    return _Child(pid, code_w, out_r, err_r, status_r)


def inherited_state():
    """What every child inherits from the template besides its memory: all rlimits, the scheduling policy,
    the nice value and the CPU affinity."""
    return (tuple(resource.getrlimit(which) for which in _ALL_RLIMITS), os.sched_getscheduler(0),
            os.getpriority(os.PRIO_PROCESS, 0), tuple(sorted(os.sched_getaffinity(0))))


def _run_template(sock, settings):
    """The template's loop: fork a child per byte the server sends, hand over its pipe ends, report the wait
    status of each child it reaps. It never reads a request or an output. Never returns."""
    expected = inherited_state()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == wake_r:
                _reap(sock, wake_r)
                continue
            wanted = sock.recv(16)
            if not wanted:
                os._exit(0)  # the server is gone
            if inherited_state() != expected:
                sock.send(_RECORD.pack(b"R", 0, 0))
                os._exit(0)
            if wanted == b"c":
                sock.send(_RECORD.pack(b"K", 0, 0))  # asked only to check
                continue
            child = _fork_child(settings, ahead=wanted == b"a")
            if isinstance(child, OSError):
                sock.send(_RECORD.pack(b"E", 0, child.errno or 0))
                continue
            fds = (child.code_w, child.out_r, child.err_r, child.status_r)
            sock.sendmsg([_RECORD.pack(b"C", child.pid, 0)],
                          [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            for fd in fds:
                os.close(fd)


def _reap(sock, wake_r):
    """Reap every child that exited and send the server its wait status."""
    try:
        while os.read(wake_r, 256):
            pass
    except BlockingIOError:
        pass
    while True:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(_RECORD.pack(b"X", pid, wait_status))


class _TemplateLost(Exception):
    """The template exited or its inherited state changed: the worker must retire."""


class _Template:
    """The server's handle on the template: asks for children, collects their wait statuses."""

    def __init__(self, pid, sock):
        self.pid = pid
        self._sock = sock
        self._exits = {}

    def fork(self, ahead):
        """A fresh child (`_Child`), or the OSError that stopped its fork; raises `_TemplateLost`."""
        kind, pid, value, fds = self._ask(b"a" if ahead else b"n")
        while True:
            if kind == b"C":
                return _Child(pid, *fds)
            if kind == b"E":
                return OSError(value, os.strerror(value))
            kind, pid, value, fds = self._record()  # an exit report came first

    def check(self):
        """Raise `_TemplateLost` unless the template is there with what it hands down unchanged."""
        kind = self._ask(b"c")[0]
        while kind != b"K":
            kind = self._record()[0]

    def _ask(self, what):
        try:
            self._sock.send(what)
        except OSError as error:
            raise _TemplateLost(f"the template is gone ({error})") from error
        return self._record()

    def wait(self, pid):
        """The wait status of the child ``pid``, once the template reaped it; raises `_TemplateLost`."""
        if pid not in self._exits:
            try:
                os.kill(self.pid, signal.SIGCONT)  # a call may have stopped it
            except ProcessLookupError:
                pass
        while pid not in self._exits:
            self._record()
        return self._exits.pop(pid)

    def _record(self):
        fds = array.array("i")
        try:
            data, ancillary, _, _ = self._sock.recvmsg(_RECORD.size, socket.CMSG_SPACE(4 * fds.itemsize))
        except OSError as error:
            raise _TemplateLost(f"the template is gone ({error})") from error
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
        if len(data) != _RECORD.size:
            raise _TemplateLost("the template exited")
        kind, pid, value = _RECORD.unpack(data)
        if kind == b"R":
            raise _TemplateLost("the template's limits or scheduling were changed by a call")
        if kind == b"X":
            self._exits[pid] = value
        return kind, pid, value, list(fds)


def start_template(settings, protocol_fds):
    """Fork the template from this (still pristine) process; returns the server's `_Template`."""
    server_end, template_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        server_end.close()
        for fd in protocol_fds:
            os.close(fd)  # the host's protocol is the server's alone (and its end must close with the server)
        try:
            _run_template(template_end, settings)
        finally:
            os._exit(70)
    template_end.close()
    return _Template(pid, server_end)


def _hand_over(child, code):
    """Give the waiting child its code (it starts running when the pipe closes)."""
    try:
        _write_all(child.code_w, code.encode("utf-8", "surrogatepass"))
    except BrokenPipeError:
        pass  # the child died while waiting: its exit status tells how
    finally:
        os.close(child.code_w)


def _collect(child, pidfd, deadline, cap):
    """Read the child's stdout/stderr until it reports its status, exits, passes the cap or the deadline.

    ``pidfd`` is the child's pidfd, or None when the child was already gone before it got its code.
    Returns the output buffers, the reported status (None when the child reported none) and the
    timed-out and truncated flags.
    """
    fds = (child.out_r, child.err_r)
    buffers = {fd: bytearray() for fd in fds}
    open_fds = set(fds)
    poller = select.poll()
    for fd in fds:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    poller.register(child.status_r, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    status = None
    exited = pidfd is None
    timed_out = truncated = False
    while status is None and not (exited or truncated):  # the code may close its output and keep working
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        for fd, _ in poller.poll(remaining * 1000):
            if fd == child.status_r:
                status = _read_status(fd, poller)
            elif fd == pidfd:
                exited = True  # data the child wrote is already in the pipes: drain below
            elif fd in open_fds:
                truncated |= _drain(fd, buffers[fd], cap, open_fds, poller)
    if (status is not None or exited) and not truncated:
        truncated = _drain_rest(poller, buffers, cap, open_fds)
    return buffers, status, timed_out, truncated


def _read_status(fd, poller):
    """The status byte the child wrote after its output; None (and no more polling) when it closed the pipe."""
    data = os.read(fd, 64)  # poll said it is readable: this does not block
    if not data:
        poller.unregister(fd)
        return None
    return data[0]


def _drain(fd, buffer, cap, open_fds, poller):
    """Read what is available now; returns True when the cap was passed.

    A short read means the pipe is empty: stopping there, not at the EAGAIN that the next read would
    raise, spares almost every call a failing read and the exception it raises.
    """
    while True:
        try:
            chunk = os.read(fd, _READ_SIZE)
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
        if len(chunk) < _READ_SIZE:
            return False


def _drain_rest(poller, buffers, cap, open_fds):
    """Once the child is done: read what its pipes still hold (only those that poll says are readable)."""
    truncated = False
    while open_fds and not truncated:
        ready = [fd for fd, _ in poller.poll(0) if fd in open_fds]
        if not ready:
            return False
        for fd in ready:
            truncated |= _drain(fd, buffers[fd], cap, open_fds, poller)
    return truncated


def _execute(child, request, template):
    """Run ``request`` in the waiting ``child``; returns the reply and whether the child is reaped yet."""
    deadline = time.monotonic() + float(request["timeout_s"])
    try:
        # Opened before the hand-over: a child that fails at once would otherwise be reaped by the
        # template before its pidfd exists (ProcessLookupError).
        pidfd = os.pidfd_open(child.pid)
    except ProcessLookupError:
        pidfd = None  # it died while waiting for its code: its wait status tells how
    _hand_over(child, request["code"])
    status = None
    try:
        buffers, status, timed_out, truncated = _collect(child, pidfd, deadline, int(request["max_output_bytes"]))
    finally:
        if pidfd is not None:
            os.close(pidfd)
        try:
            os.killpg(child.pid, signal.SIGKILL)  # its session, even when it exited: leftovers go too
        except (ProcessLookupError, PermissionError):
            pass
        wait_status = None
        if status is None:  # it died, or we stopped it: its wait status says how
            try:
                wait_status = template.wait(child.pid)
            except _TemplateLost:
                pass  # it was killed (the worker retires after the reply)
        for fd in (child.out_r, child.err_r, child.status_r):
            os.close(fd)
    if status is not None:
        exit_code = status
    else:
        exit_code = -signal.SIGKILL if wait_status is None else os.waitstatus_to_exitcode(wait_status)
    if truncated and exit_code == -signal.SIGKILL:
        # Killed by us for flooding: a clean stderr means the code itself had not failed.
        exit_code = 1 if buffers[child.err_r] else 0
    reply = {
        "stdout": buffers[child.out_r].decode("utf-8", "replace"),
        "stderr": buffers[child.err_r].decode("utf-8", "replace"),
        "exit_code": exit_code,
        "timed_out": timed_out,
        "truncated": truncated,
    }
    return reply, status is None


def _failed_fork_reply(error):
    """The reply to a call whose child could not be forked."""
    return {"stdout": "", "stderr": f"the sandbox could not start the code: {error}",
            "exit_code": 1, "timed_out": False, "truncated": False}


def _other_processes(spared):
    kept = (1, os.getpid(), *spared)
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) not in kept]


def _kill_leftovers(template_pid):
    """In our own pid namespace, kill everything but init, us and the template; True when all are gone.

    The template is stopped with everything else first (so that nothing forks while we kill one by one),
    then continued: a call that stopped it costs nothing.
    """
    if not _other_processes((template_pid,)):
        if template_pid:
            os.kill(template_pid, signal.SIGCONT)
        return True  # nothing was left running: the common, fast case
    try:
        os.kill(-1, signal.SIGSTOP)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + _CLEANUP_WAIT_S
    try:
        while leftovers := _other_processes((template_pid,)):
            if time.monotonic() > deadline:
                return False
            for pid in leftovers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.002)
    finally:
        if template_pid:
            try:
                os.kill(template_pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    return True


def _empty_directory(path, keep=()):
    """Remove everything below ``path`` but its top-level entries named in ``keep`` (read-only mounts of
    the interpreter), however deep or locked, in time linear in the number of entries: each directory is
    listed once (walking with chdir: no long paths)."""
    os.chdir(path)
    stack = [("", _unlink_files(keep))]  # (a directory's name in its parent, its subdirectories still to remove)
    while stack:
        name, subdirectories = stack[-1]
        if subdirectories:
            subdirectory = subdirectories.pop()
            os.chmod(subdirectory, 0o700)  # the code may have locked its own directories
            os.chdir(subdirectory)
            stack.append((subdirectory, _unlink_files(())))
        else:
            stack.pop()
            if stack:
                os.chdir("..")
                os.rmdir(name)
    os.chdir("/")


def _unlink_files(keep):
    """Unlink the files of the current directory; returns its subdirectories (those in ``keep`` left alone)."""
    subdirectories = []
    with os.scandir(".") as entries:
        for entry in entries:
            if entry.name in keep:
                continue
            if entry.is_dir(follow_symlinks=False):
                subdirectories.append(entry.name)
            else:
                os.unlink(entry.name)
    return subdirectories


def _clean_up(settings, template_pid):
    if settings["own_pid_namespace"] and not _kill_leftovers(template_pid):
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


def _libc():
    import ctypes

    return ctypes, ctypes.CDLL(None, use_errno=True)


def _make_undumpable():
    # Code running as the same uid cannot then ptrace us or open /proc/<worker>/fd.
    try:
        _libc()[1].prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def _limit_scratch(dirs, size_bytes, inodes):
    """Remount each scratch tmpfs with an inode cap as well as its size (bubblewrap sets only the size):
    without it, empty files and directories hold kernel memory that no size limit counts. Returns what
    could not be capped (where the host forbids even root to remount), for the host to report."""
    ctypes, libc = _libc()
    options = f"size={int(size_bytes)},nr_inodes={int(inodes)}".encode()
    problems = []
    for path in dirs:
        # MS_REMOUNT | MS_NOSUID | MS_NODEV, as bubblewrap mounted it
        if libc.mount(b"tmpfs", path.encode(), b"tmpfs", 32 | 2 | 4, options) != 0:
            problems.append(f"no inode cap on {path}: {os.strerror(ctypes.get_errno())}")
    return problems


def _install_filter(program):
    """Install the seccomp filter (`rapo_tools.sandbox.seccomp`) on this process and all it will fork."""
    ctypes, libc = _libc()

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    code = ctypes.create_string_buffer(program, len(program))
    fprog = Program(len(program) // 8, ctypes.addressof(code))
    # PR_SET_NO_NEW_PRIVS = 38 (needed without CAP_SYS_ADMIN), PR_SET_SECCOMP = 22, SECCOMP_MODE_FILTER = 2
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "could not install the seccomp filter")


def _readable(fd):
    """Whether ``fd`` has data waiting right now."""
    return bool(select.select([fd], [], [], 0)[0])


def _retire(proto_out, why):
    """Tell the host this worker takes no more calls, and exit."""
    _send(proto_out, {"worker_retiring": True})
    sys.exit(why)


def _serve(proto_in, proto_out, settings, template):
    """Answer requests until the host closes the protocol, or retire when a clean-up fails, the template is
    lost or a call changed what the calls inherit."""
    expected = inherited_state()
    try:
        child = template.fork(ahead=True)
    except _TemplateLost:
        child = None  # the first request finds out, and the worker retires after its reply
    while True:
        request = _receive(proto_in)
        if request is None:
            return
        lost = None
        if not isinstance(child, _Child):
            try:
                child = template.fork(ahead=False)  # none was forked ahead, or that fork failed
            except _TemplateLost as error:
                lost, child = error, OSError(f"the sandbox worker lost its template: {error}")
        if isinstance(child, OSError):
            _send(proto_out, _failed_fork_reply(child))
        else:
            reply, reaped = _execute(child, request, template)
            _send(proto_out, reply)
            if not reaped:
                try:
                    template.wait(child.pid)  # killed already; its teardown ran while the host read the reply
                except _TemplateLost as error:
                    lost = error
        if lost is not None:
            _retire(proto_out, str(lost))
        # Clean before the next child exists, so that it starts from an empty scratch and no leftovers.
        if not _clean_up(settings, template.pid):
            _retire(proto_out, "leftover processes or files could not be removed")
        if inherited_state() != expected:
            _retire(proto_out, "a call changed the worker's limits or scheduling")
        # Fork ahead only when idle: with the next request already queued (a saturated pool), a child
        # forked now would only make this worker's own work copy pages it shares with that child.
        saturated = request.get("calls_waiting") or _readable(proto_in)
        try:
            if saturated:
                child = None
                template.check()  # what forking ahead would have checked
            else:
                child = template.fork(ahead=True)
        except _TemplateLost as error:
            _retire(proto_out, str(error))
        _write_all(proto_out, _READY_FRAME)


def main():
    settings = json.loads(sys.argv[1])
    limits = dict(settings["limits"])
    if limits.get("max_processes") is not None:
        limits["max_processes"] = int(limits["max_processes"]) + 1  # the template runs as the same uid
    settings["rlimits"] = rlimit_table(limits)
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # a module that prints on import cannot corrupt the protocol
    problems = []
    if settings.get("scratch_inodes"):
        problems = _limit_scratch(settings["scratch_dirs"], settings["scratch_bytes"], settings["scratch_inodes"])
    if settings.get("seccomp"):
        _install_filter(bytes.fromhex(settings["seccomp"]))
    if settings.get("drop_to"):
        _drop_privileges(settings["drop_to"])
    loaded, failed = _preload(settings["preload"])
    _warm_up(settings.get("warmup", ""))
    _make_undumpable()
    sys.stdout.flush()
    sys.stderr.flush()
    if not _clean_up(settings, 0):
        sys.exit("the scratch directories could not be emptied")
    template = start_template(settings, (proto_in, proto_out))  # before any request: it never sees one
    _send(proto_out, {"ready": True, "preloaded": loaded, "failed": failed, "problems": problems})
    _serve(proto_in, proto_out, settings, template)


if __name__ == "__main__":
    main()
