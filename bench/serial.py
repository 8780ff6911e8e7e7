#!/usr/bin/env python3
"""Each serial mode's own cost, on a pseudo-terminal, against the running daemon.

For each mode (line, frame, console, modbus) and each baud rate, a daemon is started on a pty
(`edgellm serve --mqtt off --serial PTY:BAUD:MODE`, `EDGELLM_LOG=info`) and sent `--runs`
requests (plus one warm-up) one after the other. Per request:

- **front-end overhead**: the time from the last request byte written to the first answer
  byte read, minus the engine's queue_ms + ttft_ms from the daemon's `answered` log line of
  that request (one per answer): what the serial front end adds;
- **answer needs (B/s)**: the bytes the answer puts on the line, over the time from the first
  answer byte to the last, against what the line can carry (8N1: baud / 10). A pty paces
  nothing, so this says which of the two would bound a real UART at that rate;
- **line bytes per answer byte**: those bytes over the bytes of answer text (the protocol's
  overhead).

What "request", "first answer byte" and "line bytes" are, per mode:

- `line`: `GEN <prompt>` with `SET stream=on`; the first byte of the first `DATA` line; the
  bytes of the `DATA` and `END` lines.
- `frame`: a REQUEST frame (raw text, max_tokens set), CRC-16/MODBUS low byte first as in
  docs/serial.md; the appliance's ACK of the request is *not* the answer: the first answer
  byte is the first byte of the first DATA frame. Every answer frame is ACKed at once (stop
  and wait); line bytes are the answer frames and the master's ACKs (the ACK round trips are
  part of the time too), up to the END frame.
- `console`: the prompt is typed (its echo read back), then Enter (CR). The console echoes
  CR LF at once on Enter; that echo is *not* the answer: the first answer byte is the first
  byte after it. The console sends chat messages (the model's template), with
  `limits.max_tokens` as the answer bound (set from `--tokens` through a config file). Line
  bytes: everything after the echo up to and including the next `edgellm> ` prompt.
- `modbus` (RTU, unit 1, a pure-Python master built here): FC16 writes of the prompt (256-)
  and of PROMPT_LEN/MAX_TOKENS (17-18), then FC16 of REQUEST_SEQ (16) — its last byte is the
  "last request byte". Then STATUS…PAGE_COUNT (0, count 7) is polled with FC03 in a tight
  loop (no sleep: the next poll goes out as soon as the reply is in). Modbus has no "first
  answer byte" on the wire; here it is the moment the reply of the first poll that shows
  the answer started (ANSWER_LEN > 0, or status done/error) was fully read. It is late by up
  to one poll round trip (its median is printed under the table) and the tight loop costs
  the daemon CPU on a small machine. The answer's end is the poll that shows status done;
  then the pages are read with FC23 (write PAGE_SELECT, read the page). Line bytes are the
  register traffic of a master that polls only once (requests and replies both ways: the
  prompt and parameter writes, the REQUEST_SEQ write, one poll, the page reads), over the
  answer's generation time — what the line would need to carry to keep up if the polls are
  few; each extra poll costs 8 + 19 bytes more.

    bench/serial.py [--mode line|frame|console|modbus|all] [--runs N] [--tokens N]
                    [--bin target/release/edgellm] [--model FILE]

Prints a Markdown table. Numbers are of this machine; ratios and the bound are what carry over.
"""
import argparse, os, re, select, statistics, struct, subprocess, tempfile, time, tty

MODES = ["line", "frame", "console", "modbus"]
ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=MODES + ["all"], default="all")
ap.add_argument("--runs", type=int, default=20)
ap.add_argument("--tokens", type=int, default=32)
ap.add_argument("--bin", default="target/release/edgellm")
ap.add_argument("--model", default=os.path.expanduser(
    os.environ.get("EDGELLM_MODEL_DIR", "~/.cache/edgellm/models") + "/smollm2-135m-q4_0.gguf"))
ap.add_argument("--threads", default="2")
a = ap.parse_args()

PROMPT = "Request {}: tell me about pumps and valves"


# --- the pty, with the time each byte arrived ---------------------------------------------

class Port:
    """Bytes from the pty master; remembers when each read() returned, so a caller can ask
    when the first (or last) byte of what it takes arrived, however late it asks."""

    def __init__(self, fd):
        self.fd, self.buf, self.base, self.stamps = fd, bytearray(), 0, []

    def write(self, data):
        os.write(self.fd, data)
        return time.monotonic()

    def _fill(self, deadline):
        r, _, _ = select.select([self.fd], [], [], max(deadline - time.monotonic(), 0))
        if not r:
            raise SystemExit("serial bench: no answer in time")
        data = os.read(self.fd, 4096)
        self.stamps.append((self.base + len(self.buf), time.monotonic()))
        self.buf += data

    def _time_at(self, off):
        for start, t in reversed(self.stamps):
            if start <= off:
                return t
        raise AssertionError("no stamp")

    def take(self, n, within=60):
        """The next n bytes, the time the first arrived, the time the last arrived."""
        deadline = time.monotonic() + within
        while len(self.buf) < n:
            self._fill(deadline)
        data = bytes(self.buf[:n])
        t0, t1 = self._time_at(self.base), self._time_at(self.base + n - 1)
        del self.buf[:n]
        self.base += n
        keep = [s for s in self.stamps if s[0] <= self.base][-1:]
        self.stamps = keep + [s for s in self.stamps if s[0] > self.base]
        return data, t0, t1

    def until(self, sep, within=60):
        """Up to and including sep, the time of its first and last byte."""
        deadline = time.monotonic() + within
        while sep not in self.buf:
            self._fill(deadline)
        return self.take(self.buf.index(sep) + len(sep))


# --- the daemon ---------------------------------------------------------------------------

READY = {"line": b"serial port open", "frame": b"serial port open",
         "console": b"serial port open", "modbus": b"Modbus RTU serving"}


def start_daemon(baud, mode):
    master, slave = os.openpty()
    tty.setraw(slave)
    path = os.ttyname(slave)
    log = tempfile.NamedTemporaryFile(prefix="edgellm-serial-", suffix=".log", delete=False)
    # limits.max_tokens is the console's answer bound; the other modes ask for --tokens.
    cfg = tempfile.NamedTemporaryFile("w", prefix="edgellm-serial-", suffix=".toml",
                                      delete=False)
    cfg.write(f"[limits]\nmax_tokens = {a.tokens}\n")
    cfg.close()
    env = dict(os.environ, EDGELLM_LOG="info", NO_COLOR="1")
    d = subprocess.Popen([a.bin, "serve", "--config", cfg.name, "-m", a.model, "--mqtt", "off",
                          "-t", a.threads, "-c", "512", "--serial", f"{path}:{baud}:{mode}"],
                         stdout=subprocess.DEVNULL, stderr=log, env=env)
    until = time.monotonic() + 60
    while READY[mode] not in open(log.name, "rb").read():
        if time.monotonic() > until or d.poll() is not None:
            tail = open(log.name, errors="replace").read()[-2000:]
            d.kill()
            d.wait()
            os.unlink(log.name)
            os.unlink(cfg.name)
            raise SystemExit(f"serial bench: the daemon did not open the port ({mode}):\n{tail}")
        time.sleep(0.05)
    return d, master, slave, log.name, cfg.name


def engine_ms(logfile, n):
    """queue_ms + ttft_ms of the last n `answered` lines, in order."""
    time.sleep(0.2)
    text = open(logfile, encoding="utf-8", errors="replace").read()
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    eng = [float(q) + float(t) for q, t in
           re.findall(r'queue_ms="?([\d.]+)"?.*?ttft_ms="?([\d.]+)"?', text)]
    return eng[-n:]


# --- line mode ----------------------------------------------------------------------------

def line_setup(port):
    for cmd in ["SET stream=on", f"SET max_tokens={a.tokens}"]:
        port.write(cmd.encode() + b"\r\n")
        line = port.until(b"\r\n", 10)[0]
        assert line.startswith(b"OK"), line


def line_request(port, i):
    """(t_sent, t_first, t_end, line_bytes, text_bytes) of one request."""
    t_sent = port.write(b"GEN " + PROMPT.format(i).encode() + b"\r\n")
    t_first, nbytes, text = None, 0, 0
    while True:
        line, t0, t1 = port.until(b"\r\n")
        nbytes += len(line)
        if t_first is None:
            t_first = t0
        if line.startswith(b"END"):
            return t_sent, t_first, t1, nbytes, text
        assert line.startswith(b"DATA"), line
        text += len(line) - 7  # "DATA " and CR LF (escapes counted as sent)


# --- frame mode (docs/serial.md, "Frame mode") --------------------------------------------

def crc16(data):
    """CRC-16/MODBUS: reflected 0xA001, init 0xFFFF, no final XOR."""
    crc = 0xFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
    return crc


assert crc16(b"123456789") == 0x4B37


def frame(seq, ftype, payload):
    head = bytes([0xA5]) + struct.pack("<HBB", len(payload), seq, ftype) + payload
    return head + struct.pack("<H", crc16(head))


# docs/serial.md's worked example: REQUEST seq 1, chat, max_tokens 16, "Hi".
assert frame(1, 0x01, bytes([0, 16, 0]) + b"Hi") == bytes.fromhex("A5 05 00 01 01 00 10 00 48 69 BA 3A")


def read_frame(port):
    """(seq, type, payload, raw, t_first, t_last); skips noise before the start byte."""
    while True:
        b, t0, _ = port.take(1)
        if b == b"\xa5":
            break
    head, _, _ = port.take(4)
    n, seq, ftype = struct.unpack("<HBB", head)
    rest, _, t1 = port.take(n + 2)
    raw = b"\xa5" + head + rest
    assert crc16(raw[:-2]) == struct.unpack("<H", raw[-2:])[0], "bad CRC from the appliance"
    return seq, ftype, rest[:n], raw, t0, t1


def frame_setup(port):
    pass


def frame_request(port, i):
    seq = (i + 1) & 0xFF
    payload = struct.pack("<BH", 0x01, a.tokens) + PROMPT.format(i).encode()  # bit 0: raw text
    t_sent = port.write(frame(seq, 0x01, payload))
    s, ftype, p, _, _, _ = read_frame(port)
    assert (s, ftype) == (seq, 0x81), (s, hex(ftype), p)  # the ACK of the REQUEST
    t_first, nbytes, text = None, 0, 0
    while True:
        s, ftype, p, raw, t0, t1 = read_frame(port)
        assert s == seq and ftype in (0x83, 0x84, 0x85), (s, hex(ftype), p)
        (index,) = struct.unpack("<H", p[:2])
        assert index != 0xFFFF, ("refused", p)
        if t_first is None:
            t_first = t0
        ack = frame(seq, 0x02, struct.pack("<H", index))
        port.write(ack)
        nbytes += len(raw) + len(ack)
        if ftype == 0x83:
            text += len(p) - 2
        else:
            assert ftype == 0x84, ("answer error", p)
            return t_sent, t_first, t1, nbytes, text


# --- console (docs/serial.md, "Console") --------------------------------------------------

CONSOLE_PROMPT = b"edgellm> "


def console_setup(port):
    port.until(CONSOLE_PROMPT, 10)  # the greeting: CR LF and the prompt


def console_request(port, i):
    text = PROMPT.format(i).encode()
    port.write(text)
    echo = port.take(len(text), 10)[0]
    assert echo == text, echo
    t_sent = port.write(b"\r")
    assert port.take(2, 10)[0] == b"\r\n"  # Enter's echo, at once: not the answer
    out, t_first, t_end = port.until(b"]\r\n" + CONSOLE_PROMPT)
    answer = out[:out.rindex(b"\r\n[")] if b"\r\n[" in out else b""
    assert not out.lstrip().startswith(b"error:"), out
    return t_sent, t_first, t_end, len(out), len(answer)


# --- Modbus RTU (docs/serial.md, "Modbus") ------------------------------------------------

UNIT = 1


class Master:
    """A minimal Modbus RTU master; counts the bytes both ways in `traffic`."""

    def __init__(self, port):
        self.port, self.traffic = port, 0

    def _call(self, pdu, reply_len):
        """Send unit + pdu + CRC; the reply's PDU and the time its last byte arrived.
        reply_len(first two PDU bytes) -> the reply's whole PDU length."""
        adu = bytes([UNIT]) + pdu
        adu += struct.pack("<H", crc16(adu))
        t_sent = self.port.write(adu)
        head, _, _ = self.port.take(3, 10)
        assert head[0] == UNIT, head
        if head[1] & 0x80:
            rest, _, _ = self.port.take(2, 10)
            raise SystemExit(f"serial bench: Modbus exception {head[2]:#x} to {pdu[0]:#x}")
        n = reply_len(head[1:3])
        rest, _, t1 = self.port.take(n - 2 + 2, 10)
        reply = head + rest
        assert crc16(reply[:-2]) == struct.unpack("<H", reply[-2:])[0], "bad Modbus CRC"
        self.traffic += len(adu) + len(reply)
        return reply[1:-2], t_sent, t1

    def write(self, addr, regs):
        """FC16; returns the time the request's last byte was written."""
        pdu = struct.pack(">BHHB", 16, addr, len(regs), 2 * len(regs)) + \
            struct.pack(f">{len(regs)}H", *regs)
        _, t_sent, _ = self._call(pdu, lambda h: 5)
        return t_sent

    def read(self, addr, count):
        """FC03; the registers and the time the reply was in."""
        pdu, _, t1 = self._call(struct.pack(">BHH", 3, addr, count), lambda h: 2 + h[1])
        return struct.unpack(f">{count}H", pdu[2:]), t1

    def write_read(self, waddr, regs, raddr, count):
        """FC23: write, then read, in one round trip."""
        pdu = struct.pack(">BHHHHB", 23, raddr, count, waddr, len(regs), 2 * len(regs)) + \
            struct.pack(f">{len(regs)}H", *regs)
        pdu, _, _ = self._call(pdu, lambda h: 2 + h[1])
        return struct.unpack(f">{count}H", pdu[2:])


def text_regs(b):
    b = b + b"\0" * (len(b) % 2)
    return list(struct.unpack(f">{len(b) // 2}H", b))


POLL_RTT = []  # seconds per poll round trip, all modbus runs


def modbus_setup(port):
    port.master = Master(port)


def modbus_request(port, i):
    m, seq = port.master, i + 1
    prompt = PROMPT.format(i).encode()
    m.traffic = 0
    regs = text_regs(prompt)
    for k in range(0, len(regs), 123):
        m.write(256 + k, regs[k:k + 123])
    m.write(17, [len(prompt), a.tokens])  # PROMPT_LEN, MAX_TOKENS
    t_sent = m.write(16, [seq])  # REQUEST_SEQ last: submits
    setup_traffic = m.traffic
    t_first, polls, t_prev = None, 0, time.monotonic()
    while True:
        r, t_in = m.read(0, 7)  # STATUS ERROR_CODE RESPONSE_SEQ HEARTBEAT LEN(2) PAGE_COUNT
        polls += 1
        POLL_RTT.append(t_in - t_prev)
        t_prev = t_in
        status, err, rseq = r[0], r[1], r[2]
        alen = (r[4] << 16) | r[5]
        if rseq != seq:
            continue
        if t_first is None and (alen > 0 or status in (3, 4)):
            t_first = t_in
        if status == 4:
            raise SystemExit(f"serial bench: Modbus request ended in error {err}")
        if status == 3:
            t_end, pages = t_in, r[6]
            break
    poll_bytes = (m.traffic - setup_traffic) // polls  # one poll, request and reply
    m.traffic = setup_traffic + poll_bytes
    got = b""
    for p in range(pages):
        n = min(250, alen - 250 * p)
        page = m.write_read(24, [p], 32, (n + 1) // 2)
        got += struct.pack(f">{len(page)}H", *page)[:n]
    assert len(got) == alen, (len(got), alen)
    return t_sent, t_first, t_end, m.traffic, alen


# --- the bench ----------------------------------------------------------------------------

RUN = {"line": (line_setup, line_request), "frame": (frame_setup, frame_request),
       "console": (console_setup, console_request), "modbus": (modbus_setup, modbus_request)}


def bench(baud, mode):
    d, master, slave, log, cfg = start_daemon(baud, mode)
    setup, request = RUN[mode]
    try:
        port = Port(master)
        setup(port)
        firsts, rates, ratios = [], [], []
        for i in range(a.runs + 1):
            t_sent, t_first, t_end, nbytes, text = request(port, i)
            if i == 0:
                continue  # warm-up
            firsts.append((t_first - t_sent) * 1000)
            rates.append(nbytes / max(t_end - t_first, 1e-6))
            ratios.append(nbytes / max(text, 1))
        eng = engine_ms(log, a.runs)
        assert len(eng) == a.runs, f"{len(eng)} answered lines for {a.runs} runs"
        over = [f - e for f, e in zip(firsts, eng)]
        return over, rates, ratios
    finally:
        d.terminate()
        d.wait(timeout=20)
        os.close(master)
        os.close(slave)
        os.unlink(log)
        os.unlink(cfg)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


print("| mode | baud | runs | front-end overhead p50 / p99 (ms) | answer needs (B/s) | "
      "line carries (B/s) | line bytes per answer byte | bound |")
print("|---|---|---|---|---|---|---|---|")
for mode in MODES if a.mode == "all" else [a.mode]:
    for baud in (9600, 115200):
        over, rates, ratios = bench(baud, mode)
        need = statistics.median(rates)
        carry = baud / 10
        bound = "the line" if need > carry else "the engine"
        print(f"| {mode} | {baud} | {len(over)} | {pct(over, 50):.2f} / {pct(over, 99):.2f} | "
              f"{need:.0f} | {carry:.0f} | {statistics.median(ratios):.2f} | {bound} |",
              flush=True)
if POLL_RTT:
    print(f"\nModbus: {len(POLL_RTT)} polls, round trip p50 {pct(POLL_RTT, 50) * 1000:.2f} ms "
          f"(the first-answer time is late by up to one of these).")
