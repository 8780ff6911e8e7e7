#!/usr/bin/env python3
"""The emulated board's checks, run from the host by scripts/board-test.sh (which makes the
disk image in --work). Python's standard library only.

The board is qemu-system-aarch64 -M virt -cpu cortex-a72 with:
  the console (PL011)   a unix socket; root is logged in there and the checks run commands
  the PLC's UART        a USB FTDI adapter (the guest's /dev/ttyUSB0) on a pty of this host
  the network           user-mode, restrict=on: only 10.0.2.100:1883, forwarded (socat, one
                        per connection) to the Mosquitto this script starts on 127.0.0.1, and
                        the guest's port 502 from a free port of this host's 127.0.0.1
  the disk              virtio, cache=writeback: the guest's flushes reach the host file, so
                        SIGKILL of qemu is a power cut

Checks, in order (each prints its time; any failure exits 1 with the reason):
  1. boot: edgellm.service reaches active (running) through READY=1 (Type=notify)
  2. a prompt over the UART in line mode, and one over MQTT, are answered
  2b. Modbus TCP on port 502 by socket activation (edgellm-modbus.socket) while the unit runs
     as User=edgellm with no capabilities: mbpoll on this host asks a question and reads it
     answered
  3. `systemctl kill -s SIGSTOP edgellm`: the watchdog restarts it
  3b. a truncated model: exit 78, not restarted, the error retained on the broker
  3c. a main process that crashes at once: 5 starts, the 6th refused by the start limit
  4. a conversation survives a reboot: the same turn again restores its prompt from flash
  5. N power cuts while conversations are being saved (each turn sends only its new message);
     after each boot every session file passes `edgellm kv verify` or was moved aside, no
     acknowledged answer is lost (the file holds at least the tokens of the last turn answered),
     and every acknowledged turn is in its conversation (`edgellm sessions list`).
"""

import argparse
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tty

# The guest root shell's prompt (scripts/board/customize.sh sets PS1).
PROMPT = "board# "

MODEL = "/usr/share/edgellm/models/smollm2-135m-q4_1.gguf"
SESSIONS = "/var/lib/edgellm/sessions"
CTX = 512
t0 = time.monotonic()


def say(msg):
    print(f"board [{time.monotonic() - t0:7.1f}s] {msg}", flush=True)


class Failed(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failed(msg)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    """A Mosquitto of our own on 127.0.0.1, with a configuration written here."""

    def __init__(self, work):
        self.port = free_port()
        conf = os.path.join(work, "mosquitto.conf")
        with open(conf, "w") as f:
            f.write(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        self.log = open(os.path.join(work, "mosquitto.log"), "w")
        self.proc = subprocess.Popen(["mosquitto", "-c", conf], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise Failed("mosquitto did not start (see mosquitto.log)")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


class Console:
    """The guest's console: a reader thread keeps everything it prints (also in console.log)."""

    def __init__(self, path, log, alive):
        self.alive = alive
        deadline = time.monotonic() + 30
        while True:
            try:
                self.sock = socket.socket(socket.AF_UNIX)
                self.sock.connect(path)
                break
            except OSError:
                if time.monotonic() > deadline or not alive():
                    raise Failed(f"qemu's console socket {path} cannot be reached")
                time.sleep(0.2)
        self.buf = ""
        self.lock = threading.Condition()
        self.log = log
        self.n = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        while True:
            try:
                b = self.sock.recv(4096)
            except OSError:
                b = b""
            if not b:
                return
            text = b.decode("utf-8", "replace")
            self.log.write(text)
            self.log.flush()
            with self.lock:
                self.buf += text
                self.lock.notify_all()

    def wait(self, pattern, timeout, since=0):
        """Waits until `pattern` appears after offset `since`; returns the match."""
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        with self.lock:
            while True:
                m = rx.search(self.buf, since)
                if m:
                    return m
                left = deadline - time.monotonic()
                if left <= 0 or not self.alive():
                    tail = self.buf[-600:]
                    why = f"within {timeout}s" if left <= 0 else "before qemu exited"
                    raise Failed(f"console: no {pattern!r} {why}; last output:\n{tail}")
                self.lock.wait(min(left, 1.0))

    def mark(self):
        with self.lock:
            return len(self.buf)

    def send(self, text):
        self.sock.sendall(text.encode())

    def sh(self, cmd, timeout=60, ok=True):
        """Runs `cmd` in the guest's root shell; returns (exit status, output)."""
        self.n += 1
        n = self.n
        start = self.mark()
        # The marker is printed by printf from two halves, so the command line itself (should
        # the console echo it) never matches.
        self.send(f"{cmd}; printf '%s%s:%d\\n' __E {n} $?\n")
        m = self.wait(rf"__E{n}:(\d+)\r?\n", timeout, start)
        # The prompt of the command before opens the output: it is not the command's. It may
        # also be cut: its head came before `start`, in an earlier read ("oard# …").
        out = self.buf[start : m.start()]
        for k in range(len(PROMPT) - 1, 1, -1):
            if out.startswith(PROMPT[-k:]):
                out = out[k:]
                break
        out = re.sub(r"^(board# )+", "", out, flags=re.M)
        rc = int(m.group(1))
        if ok and rc != 0:
            raise Failed(f"guest: `{cmd}` exited {rc}: {out.strip()[-800:]}")
        return rc, out.replace("\r", "")


class Board:
    def __init__(self, work, broker_port):
        self.work = work
        self.port = broker_port
        self.proc = None
        self.console = None
        self.plc = None
        self.boots = 0
        # This host's end of the guest's Modbus TCP port 502.
        self.modbus_port = free_port()

    def start(self):
        sock = os.path.join(self.work, "console.sock")
        if os.path.exists(sock):
            os.unlink(sock)
        w = self.work
        cmd = [
            "qemu-system-aarch64", "-M", "virt", "-cpu", "cortex-a72", "-smp", "2", "-m", "1024",
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-kernel", f"{w}/vmlinuz", "-initrd", f"{w}/initrd.img",
            "-append", "root=/dev/vda rw console=ttyAMA0 quiet loglevel=3 systemd.show_status=0",
            "-drive", f"file={w}/disk.img,format=raw,if=none,id=disk,cache=writeback",
            "-device", "virtio-blk-pci,drive=disk",
            # cmd: runs socat for each guest connection; a tcp: target would carry every
            # connection (a daemon restarted by its watchdog, say) over one host connection.
            "-netdev", f"user,id=net,restrict=on,guestfwd=tcp:10.0.2.100:1883-cmd:socat - TCP:127.0.0.1:{self.port}"
                       f",hostfwd=tcp:127.0.0.1:{self.modbus_port}-:502",
            # romfile=: no PXE option ROM (the kernel is given; Debian ships it in ipxe-qemu).
            "-device", "virtio-net-pci,netdev=net,romfile=",
            "-device", "virtio-rng-pci",
            "-chardev", f"socket,id=con,path={sock},server=on,wait=off",
            "-serial", "chardev:con",
            "-device", "qemu-xhci", "-chardev", "pty,id=plc", "-device", "usb-serial,chardev=plc",
        ]
        self.boots += 1
        self.qlog = open(os.path.join(w, f"qemu-{self.boots}.log"), "w+")
        self.proc = subprocess.Popen(cmd, stdout=self.qlog, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        # qemu names the pty it made: "char device redirected to /dev/pts/N (label plc)".
        deadline = time.monotonic() + 30
        pty = None
        while pty is None:
            self.qlog.seek(0)
            m = re.search(r"redirected to (/dev/pts/\d+) \(label plc\)", self.qlog.read())
            if m:
                pty = m.group(1)
            elif self.proc.poll() is not None or time.monotonic() > deadline:
                self.qlog.seek(0)
                raise Failed(f"qemu did not start: {self.qlog.read()[-800:]}")
            else:
                time.sleep(0.1)
        if self.plc is not None:
            os.close(self.plc)
        self.plc = os.open(pty, os.O_RDWR | os.O_NOCTTY)
        tty.setraw(self.plc)
        self.console = Console(sock, open(os.path.join(w, "console.log"), "a"), lambda: self.proc.poll() is None)

    def boot(self, what="boot"):
        """Starts qemu and waits for the shell and for edgellm.service to be active."""
        t = time.monotonic()
        self.start()
        self.console.wait(r"board# ", 300)
        self.console.sh("stty -echo; true")
        # active (running) only after READY=1: the unit is Type=notify.
        _, out = self.console.sh(
            "for i in $(seq 300); do s=$(systemctl is-active edgellm); "
            "[ \"$s\" = active ] && break; [ \"$s\" = failed ] && break; sleep 0.5; done; "
            "systemctl show -p ActiveState -p SubState -p Type -p NRestarts edgellm",
            timeout=200,
        )
        props = dict(l.split("=", 1) for l in out.split() if "=" in l)
        check(props.get("ActiveState") == "active" and props.get("SubState") == "running",
              f"edgellm.service is not active (running) after {what}: {props}\n"
              + self.console.sh("journalctl -u edgellm -b --no-pager | tail -n 30", ok=False)[1])
        check(props.get("Type") == "notify", f"the unit is not Type=notify: {props}")
        return time.monotonic() - t, props

    def power_cut(self):
        self.proc.kill()
        self.proc.wait(30)

    def shutdown(self):
        if self.proc and self.proc.poll() is None:
            try:
                self.console.send("systemctl poweroff\n")
                self.proc.wait(60)
            except (subprocess.TimeoutExpired, OSError):
                self.power_cut()

    # The PLC: line mode on the UART.
    def plc_line(self, line, timeout=120):
        os.write(self.plc, (line + "\r\n").encode())
        got = b""
        deadline = time.monotonic() + timeout
        while b"\n" not in got:
            left = deadline - time.monotonic()
            check(left > 0, f"UART: no answer to {line!r} within {timeout}s (got {got!r})")
            import select

            r, _, _ = select.select([self.plc], [], [], left)
            if r:
                got += os.read(self.plc, 4096)
        return got.split(b"\n", 1)[0].decode("utf-8", "replace").rstrip("\r")


class Mqtt:
    """Requests to the daemon over the host's Mosquitto, with mosquitto_rr (MQTT 5)."""

    def __init__(self, port, edgellm):
        self.port = port
        self.edgellm = edgellm
        self.n = 0

    def request(self, body, timeout=180):
        """Sends one request (a dict) and returns the final message (a dict)."""
        self.n += 1
        body = dict(body, id=body.get("id", f"board-{self.n}"))
        p = self.popen(body, timeout)
        out, err = p.communicate(timeout=timeout + 10)
        check(p.returncode == 0, f"mosquitto_rr: exit {p.returncode}: {err.strip()}")
        return json.loads(out.strip().splitlines()[-1])

    def popen(self, body, timeout, expiry=None):
        """`expiry`: seconds the broker keeps the request for a daemon that is not there (MQTT
        5 message expiry), so that the requests a power cut left waiting are not all answered
        again at the next boot, which would only make each cycle longer."""
        props = ["-D", "PUBLISH", "message-expiry-interval", str(expiry)] if expiry else []
        return subprocess.Popen(
            ["mosquitto_rr", "-V", "5", "-h", "127.0.0.1", "-p", str(self.port), "-q", "1",
             "-t", "edgellm/board/request", "-e", f"board-check/{body['id']}",
             "-m", json.dumps(body), "-W", str(timeout)] + props,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_idle(self, timeout=240, quiet=3.0):
        """Waits until the daemon's retained status says it is online with nothing queued or
        running, and stays so for `quiet` seconds: after a boot the broker redelivers the
        requests the power cut left unanswered, and the daemon answers them first."""
        p = subprocess.Popen(
            ["mosquitto_sub", "-V", "5", "-h", "127.0.0.1", "-p", str(self.port),
             "-t", "edgellm/board/status", "-W", str(timeout)],
            stdout=subprocess.PIPE, text=True)
        import select

        idle_since, last = None, None
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                r, _, _ = select.select([p.stdout], [], [], 0.5)
                if r:
                    line = p.stdout.readline()
                    if not line:
                        break
                    try:
                        last = json.loads(line)
                    except ValueError:
                        continue
                    idle = (last.get("state") == "online" and last.get("queue_depth") == 0
                            and last.get("running") is None)
                    idle_since = time.monotonic() if idle else None
                elif idle_since is not None and time.monotonic() - idle_since >= quiet:
                    return last
        finally:
            p.kill()
            p.wait()
        raise Failed(f"the daemon did not become idle within {timeout}s: last status {last}")

    def status(self, timeout=10):
        """The device's retained status (a dict; empty when there is none)."""
        p = subprocess.run(
            ["mosquitto_sub", "-V", "5", "-h", "127.0.0.1", "-p", str(self.port),
             "-t", "edgellm/board/status", "-C", "1", "-W", str(timeout)],
            capture_output=True, text=True, timeout=timeout + 10)
        try:
            return json.loads(p.stdout.strip().splitlines()[0])
        except (ValueError, IndexError):
            return {}

    def ask(self, prompt, timeout=180):
        """`edgellm ask`, as a user runs it."""
        p = subprocess.run(
            [self.edgellm, "ask", "--broker", f"127.0.0.1:{self.port}", "--device", "board",
             "--json", "-n", "8", "--temp", "0", "--timeout", str(timeout), prompt],
            capture_output=True, text=True, timeout=timeout + 30)
        check(p.returncode == 0, f"edgellm ask: exit {p.returncode}: {p.stderr.strip()}")
        return json.loads(p.stdout)


def turn(session, history, user, n=8):
    return {"session": session, "messages": history + [{"role": "user", "content": user}],
            "max_tokens": n, "temperature": 0}


def next_turn(session, user, n=8):
    """The next turn of a conversation the daemon keeps: only the new message is sent."""
    return {"session": session, "prompt": user, "max_tokens": n, "temperature": 0}


def conversation_turns(board):
    """{session: turns} of every conversation the guest keeps (`edgellm sessions list`, which
    reads while the daemon runs)."""
    _, out = board.console.sh(f"edgellm sessions list --json --state-dir {os.path.dirname(SESSIONS)}",
                              timeout=60, ok=False)
    found = re.search(r"(\[.*\])", out)
    check(found is not None, f"`edgellm sessions list --json` printed no list: {out.strip()[-400:]}")
    return {s["name"]: s["turns"] for s in json.loads(found.group(1))}


def file_tokens(final):
    """Tokens the session file holds at least once this turn's answer arrived: every prompt
    position (restored or computed) and the answer's, but its last (never fed back)."""
    u = final["usage"]
    return u["prompt_tokens"] + u["completion_tokens"] - 1


def sessions_on_flash(board):
    """{session: tokens} of every session file the guest holds, and the files moved aside.
    Fails unless every .kv file passes `edgellm kv verify` (one call for all: each call loads
    the model, seconds of emulated work)."""
    _, out = board.console.sh(
        f"cd {SESSIONS} && for f in *; do case $f in *.corrupt-*) echo \"aside $f\";; "
        f"*.kv) ;; *) [ -e \"$f\" ] && echo \"other $f\";; esac; done; "
        f"set -- *.kv; if [ -e \"$1\" ]; then edgellm kv verify -m {MODEL} --ctx {CTX} \"$@\" 2>&1; "
        f"echo \"verify-rc $?\"; fi; cd /",
        timeout=300, ok=False)
    have, aside = {}, []
    rc = re.search(r"verify-rc (\d+)", out)
    check(rc is None or rc.group(1) == "0" or re.search(r"\.kv: (?!ok )", out),
          f"`edgellm kv verify` failed: {out.strip()[-800:]}")
    for line in out.splitlines():
        # Anywhere in the line, not only at its start: the output's first line may begin with
        # the tail of a prompt whose head came in the read before (sh() strips whole prompts
        # only). A loaded CI machine once split "board# " so, and the check called a session
        # file that was there lost.
        found = re.search(r"(\S+)\.kv: (.*)$|aside (\S+\.corrupt-\S*)", line)
        if not found:
            continue
        if found.group(3):
            aside.append(found.group(3))
            continue
        name, verdict = found.group(1), found.group(2)
        check(verdict.startswith("ok "), f"a session file fails `edgellm kv verify`: {line}")
        # `kv verify` says "FILE: ok (N tokens in R records)".
        m = re.match(r"ok \((\d+) tokens", verdict)
        check(m is not None, f"unexpected `edgellm kv verify` output: {line}")
        have[name] = int(m.group(1))
    return have, aside


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True)
    ap.add_argument("--edgellm", required=True, help="this host's edgellm binary (for `edgellm ask`)")
    ap.add_argument("--power-cuts", type=int, default=20)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    a = ap.parse_args()
    work = os.path.abspath(a.work)
    rng = random.Random(a.seed)
    say(f"seed {a.seed} (--seed to repeat the power cuts' timing)")
    broker = Broker(work)
    board = Board(work, broker.port)
    mqtt = Mqtt(broker.port, os.path.abspath(a.edgellm))
    try:
        run(board, mqtt, a.power_cuts, rng)
    except Failed as e:
        say(f"FAILED: {e}")
        if board.proc is not None and board.proc.poll() is not None:
            board.qlog.seek(0)
            say(f"qemu exited {board.proc.returncode}: {board.qlog.read()[-1000:]}")
        say(f"logs: {work}/console.log, {work}/qemu-*.log, {work}/mosquitto.log")
        board.shutdown()
        broker.stop()
        sys.exit(1)
    board.shutdown()
    broker.stop()


def mbpoll(port, first, values=(), count=1):
    """Debian's mbpoll against the board's port 502: writes `values` from register `first`
    (0-based), or reads `count` registers; returns {address: value}."""
    cmd = ["mbpoll", "-m", "tcp", "-p", str(port), "-0", "-1", "-o", "10", "-r", str(first)]
    if not values:
        cmd += ["-c", str(count)]
    cmd += ["127.0.0.1"] + [str(v) for v in values]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"mbpoll {' '.join(cmd[1:])}: exit {r.returncode}: {r.stdout[-400:]} {r.stderr[-400:]}")
    return {int(a): int(v) for a, v in re.findall(r"^\[(\d+)\]:\s+(-?\d+)", r.stdout, re.M)}


def modbus_on_502(board):
    """2b: systemd binds port 502 and passes it; the daemon, without any capability, serves a
    Modbus TCP master on it."""
    t = time.monotonic()
    board.console.sh("systemctl enable --now edgellm-modbus.socket && systemctl restart edgellm; true", timeout=300)
    _, out = board.console.sh(
        "for i in $(seq 400); do [ \"$(systemctl is-active edgellm)\" = active ] && break; sleep 0.5; done; "
        "systemctl show -p ActiveState -p User -p CapabilityBoundingSet -p AmbientCapabilities edgellm; "
        "systemctl is-active edgellm-modbus.socket", timeout=250)
    props = dict(l.split("=", 1) for l in out.splitlines() if "=" in l)
    check(props.get("ActiveState") == "active" and props.get("User") == "edgellm"
          and props.get("CapabilityBoundingSet") == "" and props.get("AmbientCapabilities") == ""
          and out.rstrip().endswith("\nactive"),
          f"Modbus on 502: the unit is not active, hardened, with its socket: {out}")
    # "Hi" (two bytes a register, high byte first), 2 bytes, 4 tokens; REQUEST_SEQ last.
    mbpoll(board.modbus_port, 256, [0x4869])
    mbpoll(board.modbus_port, 17, [2, 4])
    mbpoll(board.modbus_port, 16, [1])
    deadline = time.monotonic() + 180
    while True:
        regs = mbpoll(board.modbus_port, 0, count=10)
        if regs.get(0) in (3, 4) and regs.get(2) == 1:
            break
        check(time.monotonic() < deadline, f"Modbus on 502: no answer within 180 s: {regs}")
        time.sleep(1)
    check(regs[0] == 3 and regs[9] > 0 and regs[4] * 65536 + regs[5] > 0,
          f"Modbus on 502: STATUS {regs[0]} (3 is done), ERROR_CODE {regs[1]}, TOKENS {regs[9]}: {regs}")
    rc, _ = board.console.sh("journalctl -u edgellm -b --no-pager | grep -q 'Modbus TCP on the socket systemd passed'", ok=False)
    check(rc == 0, "the daemon's log does not say it serves Modbus TCP on the socket systemd passed")
    say(f"2b. Modbus TCP on 502 by socket activation, User=edgellm, no capabilities: answered "
        f"{regs[9]} tokens ({regs[4] * 65536 + regs[5]} bytes) in {time.monotonic() - t:.0f}s")


def run(board, mqtt, cuts, rng):
    took, props = board.boot()
    say(f"1. booted, edgellm.service active (running) via READY=1 in {took:.0f}s: {props}")

    # 2. The UART (line mode) and MQTT.
    check(board.plc_line("PING") == "OK PONG", "UART: PING is not answered OK PONG")
    board.plc_line("SET max_tokens=8")
    a = board.plc_line("GEN The capital of France is")
    check(a.startswith("OK ") and len(a) > 3, f"UART: GEN answered {a!r}")
    say(f"2. UART (line mode, /dev/ttyUSB0): GEN -> {a!r}")
    f = mqtt.ask("What is the capital of France?")
    check(f.get("done") and f.get("text") and "error" not in f, f"MQTT: {f}")
    say(f"2. MQTT (edgellm ask): {f['text']!r}, {f['usage']}")
    modbus_on_502(board)

    # 3. The watchdog: a stopped daemon pings no more and is restarted.
    t = time.monotonic()
    _, before = board.console.sh("systemctl show -p NRestarts --value edgellm; systemctl show -p MainPID --value edgellm")
    restarts0, pid0 = (int(x) for x in before.split()[:2])
    board.console.sh("systemctl kill -s SIGSTOP edgellm")
    _, out = board.console.sh(
        "for i in $(seq 240); do n=$(systemctl show -p NRestarts --value edgellm); "
        f"s=$(systemctl is-active edgellm); [ \"$n\" -gt {restarts0} ] && [ \"$s\" = active ] && break; sleep 0.5; done; "
        "systemctl show -p NRestarts -p MainPID -p ActiveState edgellm; "
        "journalctl -u edgellm -b --no-pager | grep -m1 -i watchdog || true", timeout=200)
    props = dict(l.split("=", 1) for l in out.splitlines() if "=" in l and " " not in l.split("=", 1)[0])
    check(int(props.get("NRestarts", 0)) > restarts0 and props.get("ActiveState") == "active"
          and int(props.get("MainPID", 0)) != pid0,
          f"the watchdog did not restart the stopped daemon: {out}")
    check("watchdog" in out.lower(), f"the journal does not name the watchdog: {out}")
    say(f"3. watchdog: SIGSTOP -> restarted in {time.monotonic() - t:.0f}s ({props})")
    f = mqtt.ask("Are you back?")
    check(f.get("done") and "error" not in f, f"after the watchdog restart: {f}")

    # 3b. A truncated model (a flash that lost the file's tail): exit 78, which the unit does
    # not restart (RestartPreventExitStatus=78), and the error is retained on the broker.
    dropin = "/run/systemd/system/edgellm.service.d/truncated.conf"
    board.console.sh(
        f"head -c 4194304 {MODEL} > /run/edgellm-truncated.gguf && chmod 644 /run/edgellm-truncated.gguf && "
        f"mkdir -p {os.path.dirname(dropin)} && printf '[Service]\\nExecStart=\\nExecStart=/usr/bin/edgellm serve "
        f"--config /etc/edgellm/edgellm.toml --model /run/edgellm-truncated.gguf\\n' > {dropin} && "
        "systemctl daemon-reload")
    board.console.sh("systemctl restart edgellm; true", timeout=150)
    # Twice, more than RestartSec (5 s) apart: a unit that were restarted would be
    # activating (auto-restart) by the second look.
    looks = []
    for _ in range(2):
        _, out = board.console.sh("systemctl show -p ActiveState -p SubState -p Result -p ExecMainStatus edgellm")
        looks.append(dict(l.split("=", 1) for l in out.split() if "=" in l))
        time.sleep(8)
    for props in looks:
        check(props.get("ActiveState") == "failed" and props.get("ExecMainStatus") == "78"
              and props.get("Result") == "exit-code",
              f"a truncated model: the unit is not failed with exit 78 and left so: {looks}")
    status = mqtt.status()
    err = status.get("error", "")
    check(status.get("state") == "error" and "edgellm-truncated.gguf" in err and "end of file" in err,
          f"a truncated model: the broker's retained status is {status}")
    say(f"3b. truncated model: exit 78, not restarted ({looks[-1]}); retained status error: {status['error'][:120]!r}")

    # 3c. A crash loop is stopped by the unit's start limit (StartLimitBurst=5 in 10 min): the
    # 6th start is refused. The main process crashes at once (SIGSEGV, a drop-in's ExecStart),
    # so the loop runs at the unit's own pace (RestartSec=5s), not the emulated model load's;
    # what is tested is the unit's Restart= and StartLimit* lines on the board's systemd.
    # systemd keeps the last run's result (`signal`) when the limit refuses a restart, and says
    # so in the journal: "Start request repeated too quickly".
    t = time.monotonic()
    _, before = board.console.sh(
        # systemd reads `$$` as one `$`: the shell sees `$$`, its own pid.
        f"printf '[Service]\\nExecStart=\\nExecStart=/bin/sh -c \"kill -SEGV $$$$\"\\n' > {dropin} && "
        "systemctl daemon-reload && systemctl reset-failed edgellm && "
        f"journalctl -u edgellm -b --no-pager -o cat | grep -c 'Main process exited' || true", timeout=60)
    board.console.sh("systemctl start edgellm; true", timeout=60)
    _, out = board.console.sh(
        "for i in $(seq 120); do journalctl -u edgellm -b --no-pager -o cat | "
        "grep -q 'Start request repeated too quickly' && break; sleep 1; done; sleep 8; "
        "systemctl show -p ActiveState -p SubState -p Result -p NRestarts edgellm; "
        "echo exits=$(journalctl -u edgellm -b --no-pager -o cat | grep -c 'Main process exited'); "
        "echo refused=$(journalctl -u edgellm -b --no-pager -o cat | grep -c 'Start request repeated too quickly')",
        timeout=240)
    props = dict(l.split("=", 1) for l in out.split() if "=" in l)
    exits0 = int(before.split()[-1]) if before.split() and before.split()[-1].isdigit() else -1
    crashes = int(props.get("exits", -1)) - exits0
    check(props.get("ActiveState") == "failed" and props.get("refused") == "1"
          and props.get("NRestarts") == "5" and crashes == 5,
          f"the start limit did not stop the crash loop at its 6th start ({crashes} crashes): {out}")
    say(f"3c. crash loop: 5 starts crashed (SIGSEGV), the 6th refused by the start limit, left failed "
        f"8 s later ({props}) in {time.monotonic() - t:.0f}s")

    # Back to the real model.
    board.console.sh(f"rm {dropin} /run/edgellm-truncated.gguf && systemctl daemon-reload && "
                     "systemctl reset-failed edgellm && systemctl start edgellm", timeout=150)
    f = mqtt.ask("Are you back again?")
    check(f.get("done") and "error" not in f, f"back on the real model: {f}")

    # 4. A conversation survives a reboot.
    q1 = turn("keep", [], "My name is Ada. Remember it.")
    a1 = mqtt.request(q1)
    q2 = turn("keep", q1["messages"] + [{"role": "assistant", "content": a1["text"]}], "What is my name?")
    a2 = mqtt.request(q2)
    check("error" not in a2, f"turn 2: {a2}")
    prompt2 = a2["usage"]["prompt_tokens"]
    board.console.send("systemctl reboot\n")
    board.proc.wait(180)  # -no-reboot: qemu exits once the guest has shut down cleanly
    took, _ = board.boot("a reboot")
    again = mqtt.request(q2)
    restored = again["usage"]["restored_tokens"]
    check(again.get("text") == a2["text"], f"after the reboot turn 2 answers {again.get('text')!r}, before {a2['text']!r}")
    check(restored >= prompt2 - 1, f"after the reboot turn 2 restored {restored} of its {prompt2} prompt tokens")
    say(f"4. reboot: turn 2 again restored {restored} of {prompt2} prompt tokens from flash, same answer")

    # 5. Power cuts while sessions are being saved: conversations the daemon keeps, each turn
    # sending only its new message.
    convs = {f"cut-{i}-0": 0 for i in range(3)}  # session -> turns acknowledged
    acked = {}  # session -> tokens its file held when its last answer arrived
    stats = {"cuts": 0, "answers_acked": 0, "sessions_checked": 0, "moved_aside": 0, "min_boot_s": 1e9, "max_boot_s": 0,
             "conversation_turns_acked": 0, "conversation_turns_lost": 0}
    for cut in range(1, cuts + 1):
        # A turn on each session, all at once: they queue and are saved one after another.
        pending = {}
        for s in convs:
            q = next_turn(s, rng.choice(["Tell me about pumps.", "And valves?", "Why?", "Go on.", "Summarise."]), n=6)
            q["id"] = f"cut{cut}-{s}"
            pending[s] = (q, mqtt.popen(q, 120, expiry=20))
        # The cut lands while the queue is working: after the first answer, the next turns
        # compute, then write their records and sync them. Odd cuts come at a random moment of
        # that; even ones at a write: within 20 ms of the disk image changing (the guest's
        # writeback reaching it: a session's record, the answer journal, ext4's journal).
        first = time.monotonic() + 150
        while time.monotonic() < first and all(p.poll() is None for _, p in pending.values()):
            time.sleep(0.05)
        at_write = cut % 2 == 0
        if at_write:
            disk = os.path.join(board.work, "disk.img")
            seen = os.stat(disk).st_mtime_ns
            until = time.monotonic() + 30
            while os.stat(disk).st_mtime_ns == seen and time.monotonic() < until:
                time.sleep(0.001)
            time.sleep(rng.uniform(0.0, 0.02))
        else:
            time.sleep(rng.uniform(0.0, 6.0))
        board.power_cut()
        stats["cut_at_a_write" if at_write else "cut_at_random"] = stats.get("cut_at_a_write" if at_write else "cut_at_random", 0) + 1
        stats["cuts"] += 1
        # An answer the guest sent before the cut reaches its client within milliseconds: one
        # second for all of them, not one each (the rest never come).
        collect = time.monotonic() + 1
        for s, (q, p) in pending.items():
            try:
                out, _ = p.communicate(timeout=max(0.0, collect - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            lines = [l for l in (out or "").strip().splitlines() if l.startswith("{")]
            final = json.loads(lines[-1]) if lines else {}
            if final.get("done") and "usage" in final:
                stats["answers_acked"] += 1
                acked[s] = file_tokens(final)
                convs[s] += 1
        # A conversation near the context would be truncated (rewritten shorter): start anew.
        for s in [s for s in convs if acked.get(s, 0) > CTX // 2]:
            name, gen = s.rsplit("-", 1)
            del convs[s]
            convs[f"{name}-{int(gen) + 1}"] = 0
        took, _ = board.boot(f"power cut {cut}")
        stats["min_boot_s"] = min(stats["min_boot_s"], took)
        stats["max_boot_s"] = max(stats["max_boot_s"], took)
        idle = mqtt.wait_idle()
        _, log = board.console.sh("journalctl -b -u edgellm --no-pager | grep -c 'cut off at start' || true", ok=False)
        tails = int((log.split() or ["0"])[-1])
        stats["torn_tails_cut"] = stats.get("torn_tails_cut", 0) + tails
        have, aside = sessions_on_flash(board)
        stats["sessions_checked"] += len(have)
        stats["moved_aside"] = len(aside)
        for s, want in acked.items():
            if s not in convs:
                continue
            check(s in have or any(x.startswith(s + ".kv.corrupt-") for x in aside),
                  f"power cut {cut}: session {s} was answered but has no file: {have} {aside}")
            if s in have:
                check(have[s] >= want, f"power cut {cut}: session {s} holds {have[s]} tokens, its last acknowledged answer left {want}")
        # Every acknowledged turn is in its conversation (it was synced before its answer went
        # out); turns answered but never acknowledged may be there too.
        kept = conversation_turns(board)
        lost = {s: n - kept.get(s, 0) for s, n in convs.items() if kept.get(s, 0) < n}
        stats["conversation_turns_lost"] += sum(lost.values())
        check(not lost, f"power cut {cut}: acknowledged turns lost {lost}: kept {kept}, acknowledged {convs}")
        say(f"5. power cut {cut}/{cuts}: booted in {took:.0f}s; torn tails cut at start {tails}; files verified (tokens) {have}; aside {aside}; acknowledged (tokens) {acked}; conversation turns kept {kept}, acknowledged {convs}")
    stats["conversation_turns_acked"] = stats["answers_acked"]
    say("5. power cuts: " + json.dumps(stats))
    check(stats["answers_acked"] > 0, "no answer was acknowledged before any power cut: nothing was tested")


if __name__ == "__main__":
    main()
