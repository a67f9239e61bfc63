"""Hostile code that tries to leave state for the next call, hold memory outside the limit, flood the scratch
with inodes, or talk to the host's services over unix sockets.

Each attack runs on a one-worker sandbox, so the next call lands on the worker the attack ran in; each is
bounded (a few hundred MiB, a few tens of thousands of inodes, seconds) and ends with the health check.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import uuid

import pytest

from rapo_tools.sandbox import PythonSandbox, SandboxConfig
from rapo_tools.sandbox.cgroup import MemoryCgroup
from rapo_tools.sandbox.local_backend import interpreter_roots

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="the local sandbox needs Linux")


@pytest.fixture(scope="module")
def target(attack_sandbox):
    return attack_sandbox


def _memory_cgroups_available() -> bool:
    group = MemoryCgroup.create()
    if group is None:
        return False
    group.remove()
    return True


# Call 1 hides a secret in every place that could outlive a process; call 2 looks in all of them.
HIDE = (
    "import ctypes, os\nfrom multiprocessing import shared_memory\n"
    "libc = ctypes.CDLL(None, use_errno=True)\nsecret = {secret!r}.encode()\nhidden = []\n"
    "shm = libc.shmget(0x5EC, 4096, 0o1666)\n"  # SysV shared memory, message queue, semaphores
    "if shm != -1:\n    hidden.append('sysv-shm')\n"
    "if libc.msgget(0x5EC, 0o1666) != -1:\n    hidden.append('sysv-msg')\n"
    "if libc.semget(0x5EC, 1, 0o1666) != -1:\n    hidden.append('sysv-sem')\n"
    "if libc.syscall(248, b'user', b'rapo', secret, len(secret), -4) != -1:\n"  # add_key to the user keyring
    "    hidden.append('user-keyring')\n"
    "block = shared_memory.SharedMemory('rapo-secret', create=True, size=64)\n"  # POSIX shm: /dev/shm
    "block.buf[:len(secret)] = secret\nblock.close()\n"
    "open('/tmp/secret', 'wb').write(secret)\n"
    "os.makedirs('/tmp/.hidden/deeper', exist_ok=True)\nopen('/tmp/.hidden/deeper/secret', 'wb').write(secret)\n"
    "print(hidden)"
)
SEEK = (
    "import ctypes, glob, os\nlibc = ctypes.CDLL(None, use_errno=True)\nfound = []\n"
    "for name in ('shm', 'msg', 'sem'):\n"
    "    found += open(f'/proc/sysvipc/{name}').read().splitlines()[1:]\n"
    "found += [libc.shmget(0x5EC, 0, 0), libc.msgget(0x5EC, 0), libc.semget(0x5EC, 0, 0)]\n"
    "buffer = ctypes.create_string_buffer(64)\n"
    "key = libc.syscall(249, b'user', b'rapo', None, 0)\n"  # request_key, then keyctl(KEYCTL_READ)
    "found.append(libc.syscall(250, 11, key, buffer, 64) if key != -1 else -1)\n"
    "import sys\n"
    # A venv kept under /tmp (a CI clone) is bound read-only for the interpreter: its folder is no leftover.
    "interpreter = (os.path.realpath(sys.prefix) + '/', os.path.realpath(sys.base_prefix) + '/')\n"
    "found += [path for path in glob.glob('/dev/shm/*') + glob.glob('/tmp/*') + glob.glob('/tmp/.*')\n"
    "          if not any(prefix.startswith(os.path.realpath(path) + '/') for prefix in interpreter)]\n"
    "print(found)"
)


def test_no_secret_reaches_the_next_call(single_worker_sandbox, healthy):
    # The red team read episode A's secret in a later episode through SysV shared memory.
    secret = uuid.uuid4().hex
    hid = single_worker_sandbox.run_sync(HIDE.format(secret=secret))
    assert hid.ok and hid.text == "[]\n", hid.text  # every SysV object and the keyring refused
    seek = single_worker_sandbox.run_sync(SEEK)
    assert seek.ok, seek.text
    assert seek.text == "[-1, -1, -1, -1]\n"
    assert secret not in seek.text
    healthy(single_worker_sandbox)


def test_memfd_and_tmpfs_cannot_hold_memory_past_the_limits(target, healthy):
    # memfd's memory counted in no rlimit (512 MiB with memory_mb=256); the scratch tmpfs are size-capped.
    code = (
        "import errno, os\nheld = {}\n"
        "try:\n"
        "    os.memfd_create('hoard')\n"
        "    held['memfd'] = 'created'\n"
        "except OSError as error:\n"
        "    held['memfd'] = errno.errorcode[error.errno]\n"
        "for directory in ('/tmp', '/dev/shm'):\n"
        "    total = 0\n"
        "    try:\n"
        "        for index in range(128):\n"  # 128 x 4 MiB = 512 MiB at most
        "            with open(f'{directory}/hoard{index}', 'wb') as handle:\n"
        "                handle.write(b'1' * (4 << 20))\n"
        "            total += 4\n"
        "    except OSError:\n"
        "        pass\n"
        "    held[directory] = total\n"
        "print(held)"
    )
    result = target.run_sync(code)
    assert result.ok, result.text
    held = eval(result.text)  # a dict literal the sandbox printed
    assert held["memfd"] == "EPERM"
    assert held["/tmp"] <= target.config.scratch_mb and held["/dev/shm"] <= target.config.scratch_mb
    healthy(target)


@pytest.fixture(scope="module")
def memory_sandbox():
    """A small-footprint worker (math only) with a 128 MiB budget per call and a generous timeout."""
    config = SandboxConfig(pool_size=1, light_pool=False, preload_modules=("math",), warmup_code="", timeout_s=20,
                           cpu_s=20, memory_mb=128, max_processes=32, scratch_mb=16)
    with PythonSandbox(config) as shared:
        yield shared


@pytest.mark.skipif(not _memory_cgroups_available(), reason="no memory cgroup can be made here (root or delegation)")
def test_many_processes_cannot_add_up_past_the_memory_cgroup(memory_sandbox, healthy):
    # The address-space limit is per process: 8 processes x 96 MiB each pass it, 768 MiB together. The
    # worker's memory cgroup caps them all together (a call's budget, its scratch, and room for copy-on-write).
    code = (
        "import os, time\nread, write = os.pipe()\n"
        "for _ in range(8):\n"
        "    if os.fork() == 0:\n"
        "        try:\n"
        "            block = bytearray(96 << 20)\n"  # zero-filled: every page touched
        "            os.write(write, b'+')\n"
        "        except MemoryError:\n"
        "            os.write(write, b'-')\n"
        "        time.sleep(15)\n"
        "        os._exit(0)\n"
        "os.close(write)\nos.set_blocking(read, False)\n"
        "held, dead, deadline = b'', 0, time.time() + 15\n"
        "while len(held) + dead < 8 and time.time() < deadline:\n"  # each child either holds its block or died
        "    time.sleep(0.05)\n"
        "    try:\n"
        "        held += os.read(read, 64)\n"
        "    except BlockingIOError:\n"
        "        pass\n"
        "    while True:\n"
        "        pid, _ = os.waitpid(-1, os.WNOHANG)\n"
        "        if pid == 0:\n"
        "            break\n"
        "        dead += 1\n"
        "print(held.count(b'+'))"
    )
    result = memory_sandbox.run_sync(code)
    # Either the code reports how many blocks were held at once, or the kernel's OOM killer took the whole call.
    if result.ok:
        assert int(result.text) < 8, result.text
    else:
        assert "killed" in result.text or "died" in result.text, result.text
    healthy(memory_sandbox)


def _worker_memory_bytes(sandbox: PythonSandbox) -> int | None:
    """What the memory cgroup of ``sandbox``'s (one) full worker holds now; None where there is none (v1 only)."""
    uid = int(sandbox.run_sync("import os\nos.getuid()").text)
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.stat(f"/proc/{name}").st_uid == uid:
                with open(f"/proc/{name}/cgroup") as handle:
                    path = next(line.split(":", 2)[2].strip() for line in handle if ":memory:" in line)
                with open(f"/sys/fs/cgroup/memory{path}/memory.usage_in_bytes") as handle:
                    return int(handle.read())
        except (OSError, StopIteration):
            continue
    return None


# Everything a call could leave holding memory: a SysV segment, scratch files, a leftover process.
LEAVE_MEMORY_BEHIND = (
    "import ctypes, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
    "segment = libc.shmget(0, 64 << 20, 0o1600)\n"
    "if segment != -1:\n"
    "    ctypes.memset(libc.shmat(segment, None, 0), 1, 64 << 20)\n"
    "for directory in ('/tmp', '/dev/shm'):\n"
    "    try:\n"
    "        open(f'{directory}/ballast', 'wb').write(b'1' * (12 << 20))\n"
    "    except OSError:\n"
    "        pass\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    ballast = bytearray(64 << 20)\n"
    "    time.sleep(30)\n"
    "print('left')"
)


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir("/sys/fs/cgroup/memory"),
                    reason="reads the worker's cgroup v1 memory counter (root)")
def test_no_memory_stays_held_after_the_calls(memory_sandbox, healthy):
    # The red team: four calls with memory_mb=256 left 1 GiB resident, until the worker died.
    before = _worker_memory_bytes(memory_sandbox)
    if before is None:
        pytest.skip("the worker has no memory cgroup here")
    for _ in range(4):
        result = memory_sandbox.run_sync(LEAVE_MEMORY_BEHIND)
        assert result.ok and result.text == "left\n", result.text
    healthy(memory_sandbox)
    after = _worker_memory_bytes(memory_sandbox)
    assert after is not None and after - before < 32 << 20, (before, after)


def test_an_inode_flood_is_capped_and_the_next_call_is_unharmed(target, healthy):
    # 60,000 empty directories took well under a second; their quadratic clean-up then broke the next call.
    code = (
        "import errno, os\nmade = {}\n"
        "for directory in ('/tmp', '/dev/shm'):\n"
        "    count = 0\n"
        "    try:\n"
        "        for index in range(60_000):\n"
        "            os.mkdir(f'{directory}/d{index}')\n"
        "            count += 1\n"
        "    except OSError as error:\n"
        "        made[directory] = (count, errno.errorcode[error.errno])\n"
        "    else:\n"
        "        made[directory] = (count, None)\n"
        "print(made)"
    )
    result = target.run_sync(code)
    assert result.ok, result.text
    made = eval(result.text)  # a dict literal the sandbox printed
    if os.geteuid() == 0:  # the inode cap needs the worker to remount its scratch, which root can
        for count, error in made.values():
            assert count < target.config.scratch_inodes and error == "ENOSPC"
    healthy(target)


def test_a_deep_and_wide_tree_is_removed(target, healthy):
    code = (
        "import os\n"
        "os.chdir('/tmp')\n"
        "for _ in range(3000):\n"  # deep
        "    os.mkdir('d')\n"
        "    os.chdir('d')\n"
        "    open('f', 'w').close()\n"
        "for index in range(3000):\n"  # and wide, at the bottom
        "    os.mkdir(f'w{index}')\n"
        "os.chmod('.', 0)\n"
        "print('planted')"
    )
    result = target.run_sync(code)
    assert result.ok and result.text == "planted\n", result.text
    healthy(target)


class _UnixServer:
    """A host unix socket server (filesystem or abstract) that records whether anybody connected."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(address)
        if not address.startswith("\0"):
            os.chmod(address, 0o777)  # world-connectable, like a database or container engine socket
        self.listener.listen()
        self.listener.settimeout(0.1)
        self.connected = False
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                continue
            self.connected = True
            connection.sendall(b"hello from the host")
            connection.close()

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)
        self.listener.close()
        if not self.address.startswith("\0"):
            os.unlink(self.address)


def test_host_unix_sockets_are_unreachable(target, healthy):
    # The host filesystem is bound read-only, but connecting to a socket needs no write access.
    name = f"rapo-test-{uuid.uuid4().hex[:12]}.sock"
    addresses = [f"/var/tmp/{name}", f"\0{name}"]
    if os.access("/run", os.W_OK):
        addresses.append(f"/run/{name}")
    servers = [_UnixServer(address) for address in addresses]
    try:
        code = (
            "import socket\n"
            f"for address in {addresses!r}:\n"
            "    try:\n"
            "        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            "        client.settimeout(2)\n"
            "        client.connect(address)\n"
            "        print('connected', client.recv(64))\n"
            "    except OSError as error:\n"
            "        print('blocked', error.errno)"
        )
        result = target.run_sync(code)
    finally:
        for server in servers:
            server.close()
    assert result.ok, result.text
    assert result.text == "blocked 97\n" * len(addresses)  # EAFNOSUPPORT: no unix socket can be made at all
    assert not any(server.connected for server in servers)
    healthy(target)


def test_host_datagram_sockets_are_unreachable_through_a_socketpair(target, healthy):
    # sendto() on a datagram socketpair takes any address: it would reach /dev/log or a journal socket.
    path = f"/var/tmp/rapo-test-{uuid.uuid4().hex[:12]}.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    os.chmod(path, 0o777)
    server.settimeout(0.5)
    try:
        code = (
            "import socket\n"
            "for kind in (socket.SOCK_DGRAM, socket.SOCK_RAW, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC):\n"
            "    try:\n"
            "        left, right = socket.socketpair(socket.AF_UNIX, kind)\n"
            f"        left.sendto(b'hello host', {path!r})\n"
            "        print('sent')\n"
            "    except OSError as error:\n"
            "        print('refused', error.errno)\n"
            "left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"  # allowed: it ignores addresses
            f"left.sendto(b'hello peer', {path!r})\n"
            "print('seqpacket', right.recv(64))"
        )
        result = target.run_sync(code)
        try:
            received = server.recv(64)
        except OSError:
            received = None
    finally:
        server.close()
        os.unlink(path)
    assert result.ok, result.text
    assert result.text == "refused 94\n" * 3 + "seqpacket b'hello peer'\n"  # ESOCKTNOSUPPORT; the pair's own peer
    assert received is None
    healthy(target)


def test_only_system_and_interpreter_directories_of_the_host_are_there(target, healthy):
    # /run and /var hold the host's service sockets and FIFOs (a FIFO on a read-only mount can still be
    # written); /home, /srv, /mnt, /opt and the like hold data and repositories.
    code = (
        "import os\n"
        "print([path for path in ('/run', '/var', '/home', '/srv', '/mnt', '/opt', '/media', '/boot', '/work/shared')"
        " if os.path.exists(path)])\n"
        "print(sorted(os.listdir('/')))"
    )
    result = target.run_sync(code)
    assert result.ok, result.text
    absent, listing = result.text.splitlines()
    assert absent == "[]"
    allowed = {path.strip("/") for path in target.config.system_paths} | {"dev", "proc", "tmp"}
    interpreter = {root.strip("/").split("/")[0] for root in interpreter_roots(sys.executable)}
    assert set(eval(listing)) <= allowed | interpreter
    healthy(target)


def test_host_fifos_are_unreachable(target, healthy):
    path = f"/var/tmp/rapo-test-{uuid.uuid4().hex[:12]}.fifo"
    os.mkfifo(path, 0o666)
    os.chmod(path, 0o666)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a host process listening on it
    try:
        code = (
            "import os\ntry:\n"
            f"    os.write(os.open({path!r}, os.O_WRONLY | os.O_NONBLOCK), b'hello host')\n"
            "    print('written')\n"
            "except OSError as error:\n"
            "    print('refused', error.errno)"
        )
        result = target.run_sync(code)
        try:
            received = os.read(reader, 64)
        except BlockingIOError:
            received = b""
    finally:
        os.close(reader)
        os.unlink(path)
    assert result.ok and result.text == "refused 2\n", result.text  # ENOENT: /var is not in the sandbox
    assert received == b""
    healthy(target)
