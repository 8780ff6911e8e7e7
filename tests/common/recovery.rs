//! A Mosquitto that stops and starts again on its port (keeping its sessions), and a
//! subscriber that keeps every message: what the recovery and fault tests are made of.

use super::mqtt::{Daemon, free_port};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A Mosquitto that can be stopped and started again on the same port, keeping its state
/// (sessions, queued messages) in `dir` when `persist` is set.
pub struct Broker {
    pub port: u16,
    conf: std::path::PathBuf,
    child: Option<Child>,
}

impl Broker {
    pub fn start(dir: &Path, persist: bool) -> Broker {
        let port = free_port();
        let conf = dir.join("mosquitto.conf");
        let persistence = if persist {
            // Started as root, Mosquitto would switch to its own user, which cannot write the
            // test's directory: it stays who started it.
            let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
            format!(
                "persistence true\npersistence_location {}/\nautosave_interval 1\nuser {user}\n",
                dir.display()
            )
        } else {
            "persistence false\n".to_owned()
        };
        std::fs::write(
            &conf,
            format!("listener {port} 127.0.0.1\nallow_anonymous true\n{persistence}"),
        )
        .unwrap();
        let mut b = Broker {
            port,
            conf,
            child: None,
        };
        b.up();
        b
    }

    pub fn up(&mut self) {
        // Held before the wait, so that a failed start is still killed on drop.
        let child = self.child.insert(
            Command::new("mosquitto")
                .arg("-c")
                .arg(&self.conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("mosquitto (scripts/setup.sh installs it)"),
        );
        super::mqtt::wait_mosquitto(child, self.port);
    }

    /// SIGTERM (Mosquitto writes its persistence file), and waits for it to exit.
    pub fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(c.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = c.wait();
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A `mosquitto_sub` that keeps every message it gets; with a client id, a persistent
/// session, so that it also gets what was published while the broker was down.
pub struct Collector {
    child: Child,
    pub got: Arc<Mutex<Vec<(String, Value)>>>,
}

impl Collector {
    /// Returns once the subscription is in place: the broker has sent it a retained probe.
    pub fn start(port: u16, topic: &str, persistent_id: Option<&str>) -> Collector {
        let probe = super::mqtt::retained_probe(port);
        let mut cmd = Command::new("mosquitto_sub");
        cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-t", topic])
            .args(["-t", &probe, "-q", "1", "-v"]);
        if let Some(id) = persistent_id {
            cmd.args(["-c", "-i", id]);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("mosquitto_sub");
        let out = child.stdout.take().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = Arc::clone(&got);
        let (subscribed, ready) = std::sync::mpsc::channel();
        let probe_topic = probe.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let Some((t, p)) = line.split_once(' ') else {
                    continue;
                };
                if t == probe_topic {
                    let _ = subscribed.send(());
                } else if let Ok(v) = serde_json::from_str(p) {
                    g.lock().unwrap().push((t.to_owned(), v));
                }
            }
        });
        // A fixed pause was not enough on a loaded machine: answers went out before it had
        // subscribed, and a collector that missed them failed the test.
        ready
            .recv_timeout(Duration::from_secs(30))
            .expect("the collector did not subscribe within 30 s");
        Collector { child, got }
    }

    /// Final messages so far, by request id.
    pub fn finals(&self) -> BTreeMap<String, Vec<(String, Value)>> {
        let mut m: BTreeMap<String, Vec<(String, Value)>> = BTreeMap::new();
        for (t, v) in self.got.lock().unwrap().iter() {
            if v["done"] == true {
                let id = v["id"].as_str().unwrap_or("?").to_owned();
                m.entry(id).or_default().push((t.clone(), v.clone()));
            }
        }
        m
    }

    /// Waits until every id in `ids` has a final message, then a moment more for any second
    /// one; panics with `log` after `within`.
    pub fn wait_all(
        &self,
        ids: &[String],
        within: Duration,
        log: &dyn Fn() -> String,
    ) -> BTreeMap<String, Vec<(String, Value)>> {
        let until = Instant::now() + within;
        loop {
            let f = self.finals();
            if ids.iter().all(|i| f.contains_key(i)) {
                std::thread::sleep(Duration::from_millis(1500));
                return self.finals();
            }
            assert!(
                Instant::now() < until,
                "answered {:?} of {ids:?}\n{}",
                f.keys().collect::<Vec<_>>(),
                log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `edgellm serve` as device `device` of the broker on `port`, on one thread with a context of
/// 256, keeping its state in `state`; `config`, when not empty, a configuration file's text
/// for what has no flag (the queue's bounds, the batch).
pub fn serve(port: u16, device: &str, state: &Path, config: &str, env: &[(&str, &str)]) -> Daemon {
    let b = format!("127.0.0.1:{port}");
    let m = super::model_path("q4_0").to_str().unwrap().to_owned();
    let s = state.to_str().unwrap().to_owned();
    let conf = state.with_extension("toml");
    let mut args = vec![
        "--model",
        &m,
        "--mqtt",
        &b,
        "--device",
        device,
        "--ctx",
        "256",
        "-t",
        "1",
        "--state-dir",
        &s,
    ];
    let c = conf.to_str().unwrap().to_owned();
    if !config.is_empty() {
        std::fs::write(&conf, config).unwrap();
        args.extend(["--config", &c]);
    }
    Daemon::start(&args, env)
}

/// The device's retained status once it counts `answered` answers.
pub fn wait_status(port: u16, device: &str, answered: usize, log: &str) -> Value {
    let status = Collector::start(port, &format!("edgellm/{device}/status"), None);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let got = status.got.lock().unwrap().last().map(|x| x.1.clone());
        if let Some(v) = &got
            && v["counters"]["answered"] == answered
        {
            return v.clone();
        }
        assert!(
            Instant::now() < until,
            "status never showed {answered} answered: {got:?}\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
