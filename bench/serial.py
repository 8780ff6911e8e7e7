#!/usr/bin/env python3
"""The serial line mode's own cost, on a pseudo-terminal, against the running daemon.

For each request (stream on): the time from the last request byte written to the first answer
byte read, minus the engine's queue + time to first token (from the daemon's `answered` log
line of that request): what the serial front end adds. Then, per baud rate set on the port,
the bytes per second the answers need against what the line can carry (8N1: baud / 10): a pty
paces nothing, so this says which of the two would bound a real UART at that rate.

    bench/serial.py [--runs N] [--tokens N] [--bin target/release/edgellm] [--model FILE]

Prints a Markdown table. Numbers are of this machine; ratios and the bound are what carry over.
"""
import argparse, os, re, select, statistics, subprocess, sys, tempfile, time, tty

ap = argparse.ArgumentParser()
ap.add_argument("--runs", type=int, default=20)
ap.add_argument("--tokens", type=int, default=32)
ap.add_argument("--bin", default="target/release/edgellm")
ap.add_argument("--model", default=os.path.expanduser(
    os.environ.get("EDGELLM_MODEL_DIR", "~/.cache/edgellm/models") + "/smollm2-135m-q4_0.gguf"))
ap.add_argument("--threads", default="2")
a = ap.parse_args()


class Reader:
    """Lines from the pty, and when the first byte since `first = None` arrived."""

    def __init__(self, fd):
        self.fd, self.buf, self.first = fd, b"", None

    def line(self, within=60):
        deadline = time.monotonic() + within
        while b"\r\n" not in self.buf:
            left = deadline - time.monotonic()
            r, _, _ = select.select([self.fd], [], [], max(left, 0))
            if not r:
                raise SystemExit("serial bench: no answer in time")
            data = os.read(self.fd, 4096)
            if self.first is None:
                self.first = time.monotonic()
            self.buf += data
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line.decode("utf-8", "replace")


def bench(baud):
    master, slave = os.openpty()
    tty.setraw(slave)
    path = os.ttyname(slave)
    log = tempfile.NamedTemporaryFile(prefix="edgellm-serial-", suffix=".log", delete=False)
    env = dict(os.environ, EDGELLM_LOG="info")
    d = subprocess.Popen([a.bin, "serve", "-m", a.model, "--mqtt", "off", "-t", a.threads,
                          "-c", "512", "--serial", f"{path}:{baud}:line"],
                         stdout=subprocess.DEVNULL, stderr=log, env=env)
    try:
        until = time.monotonic() + 60
        while b"serial port open" not in open(log.name, "rb").read():
            if time.monotonic() > until or d.poll() is not None:
                raise SystemExit("serial bench: the daemon did not open the port")
            time.sleep(0.05)
        rd = Reader(master)
        for cmd in ["SET stream=on", f"SET max_tokens={a.tokens}"]:
            os.write(master, cmd.encode() + b"\r\n")
            line = rd.line(10)
            assert line.startswith("OK"), line
        firsts, rates = [], []
        for i in range(a.runs + 1):
            rd.first = None
            os.write(master, f"GEN Request {i}: tell me about pumps and valves\r\n".encode())
            t_sent = time.monotonic()
            nbytes = 0
            while True:
                line = rd.line()
                nbytes += len(line.encode()) + 2
                if line.startswith("END"):
                    t_end = time.monotonic()
                    break
                assert line.startswith("DATA"), line
            if i == 0:
                continue  # warm-up
            firsts.append((rd.first - t_sent) * 1000)
            rates.append(nbytes / max(t_end - rd.first, 1e-6))
        # The daemon's own queue + ttft for each request, in order (warm-up excluded).
        time.sleep(0.2)
        text = open(log.name, encoding="utf-8", errors="replace").read()
        eng = [float(q) + float(t) for q, t in
               re.findall(r'queue_ms="?([\d.]+)"?.*?ttft_ms="?([\d.]+)"?', text)]
        eng = eng[-a.runs:]
        over = [f - e for f, e in zip(firsts, eng)]
        return over, rates
    finally:
        d.terminate()
        d.wait(timeout=20)
        os.close(master)
        os.close(slave)
        os.unlink(log.name)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


print(f"| baud | runs | front-end overhead p50 / p99 (ms) | answer needs (B/s) | line carries (B/s) | bound |")
print("|---|---|---|---|---|---|")
for baud in (9600, 115200):
    over, rates = bench(baud)
    need = statistics.median(rates)
    carry = baud / 10
    bound = "the line" if need > carry else "the engine"
    print(f"| {baud} | {len(over)} | {pct(over, 50):.2f} / {pct(over, 99):.2f} | {need:.0f} | "
          f"{carry:.0f} | {bound} |")
