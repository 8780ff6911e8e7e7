"""What the daemon benches share: free loopback ports, a Mosquitto of their own, stopping
what they started, percentiles as `edgellm ask` reports them. Imported by the Python parts of
bench/*.sh (they run from the repository root)."""
import signal, socket, subprocess, time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, within=20):
    """Waits until something accepts on 127.0.0.1:port; False after `within` seconds."""
    until = time.monotonic() + within
    while time.monotonic() < until:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.02)
    return False


def stop(p, within=20):
    """SIGTERM, then SIGKILL after `within` seconds."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(within)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def mosquitto(work, name, started, extra="set_tcp_nodelay true\n"):
    """Starts a Mosquitto on a free loopback port with a config written to `work`; appends
    the process to `started` and returns the port once it listens. `extra`: config lines
    (by default no Nagle delay on its sockets, which would be the broker's latency, not the
    daemon's)."""
    port = free_port()
    conf = f"{work}/{name}.conf"
    with open(conf, "w") as f:
        f.write(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n{extra}")
    started.append(subprocess.Popen(["mosquitto", "-c", conf],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    if not wait_listening(port):
        raise SystemExit(f"mosquitto on {port} does not listen")
    return port


def pct(xs, p):
    """Nearest rank, as `edgellm ask` reports it: always one of the samples."""
    xs = sorted(xs)
    if not xs:
        return None
    k = max(1, min(len(xs), -(-p * len(xs) // 100)))
    return xs[int(k) - 1]


def ask_repeat(exe, port, device, question, n, c, tokens, who, ask_timeout=300, within=900):
    """`edgellm ask --repeat n --concurrency c -n tokens --json` against the daemon `device`
    behind the broker on `port`: its summary, every request answered, or exits naming `who`.
    `ask_timeout`: ask's --timeout for each request; `within`: seconds for the whole run."""
    import json
    r = subprocess.run([exe, "ask", "--broker", f"127.0.0.1:{port}", "--device", device,
                        "--repeat", str(n), "--concurrency", str(c), "-n", str(tokens),
                        "--timeout", str(ask_timeout), "--json", question],
                       capture_output=True, text=True, timeout=within)
    if r.returncode != 0:
        raise SystemExit(f"{who}: edgellm ask failed: {r.stderr}")
    s = json.loads(r.stdout)
    if s["ok"] != n:
        raise SystemExit(f"{who}: {s['ok']} of {n} answered: {r.stdout}")
    return s
