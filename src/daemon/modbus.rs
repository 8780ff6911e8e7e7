//! Starts the Modbus servers the configuration asks for: one RTU server per `[[serial]]`
//! port in mode `modbus`, and the TCP server of `[modbus] tcp`.

use super::config::{Config, Parity, SerialFlow, SerialMode};
use super::serve::DaemonError;
use crate::serial::modbus::server::{self, ModbusConfig, RtuSettings};
use crate::serial::modbus::typed::Typed;
use crate::serial::stats::PortStats;
use crate::service::Handle;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_serial::{DataBits, FlowControl, StopBits};

/// Most bytes of answer a mailbox keeps (a 512-token answer is a few KiB).
const MAX_ANSWER_BYTES: usize = 64 << 10;

/// The running Modbus servers: their tasks (they end once `stop` is true) and their ports'
/// state and counters, for the status.
pub struct Started {
    pub tasks: Vec<JoinHandle<()>>,
    pub ports: Vec<Arc<PortStats>>,
}

/// Spawns the servers on the current runtime. The TCP listener is bound here, so a taken
/// address fails the start instead of a task later.
pub fn start(
    cfg: &Config,
    handle: &Handle,
    model_name: &str,
    stop: &watch::Receiver<bool>,
) -> Result<Started, DaemonError> {
    let l = &cfg.limits;
    let formats = typed_formats(cfg).map_err(DaemonError::Config)?;
    let base = ModbusConfig {
        unit_id: 1,
        model_name: model_name.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        max_tokens: l.max_tokens,
        timeout: Some(l.request_timeout()),
        max_prompt_bytes: usize::try_from(l.max_prompt_bytes).unwrap_or(usize::MAX),
        max_answer_bytes: MAX_ANSWER_BYTES,
        formats,
    };
    let mut out = Started {
        tasks: Vec::new(),
        ports: Vec::new(),
    };
    for s in cfg.serial.iter().filter(|s| s.mode == SerialMode::Modbus) {
        let stats = Arc::new(PortStats::new(s.path.display().to_string(), "modbus"));
        let settings = RtuSettings {
            baud: s.baud,
            rs485: s.rs485,
            // Modbus RTU is 8 data bits (the configuration's check holds it to that).
            data_bits: DataBits::Eight,
            parity: match s.parity {
                Parity::None => tokio_serial::Parity::None,
                Parity::Even => tokio_serial::Parity::Even,
                Parity::Odd => tokio_serial::Parity::Odd,
            },
            stop_bits: if s.stop_bits == 2 {
                StopBits::Two
            } else {
                StopBits::One
            },
            flow: match s.flow {
                SerialFlow::None => FlowControl::None,
                SerialFlow::RtsCts => FlowControl::Hardware,
                SerialFlow::XonXoff => FlowControl::Software,
            },
        };
        let mc = ModbusConfig {
            unit_id: u8::try_from(s.unit_id).unwrap_or(1),
            ..base.clone()
        };
        out.tasks.push(tokio::spawn(server::serve_rtu(
            s.path.clone(),
            settings,
            mc,
            handle.clone(),
            Arc::clone(&stats),
            stop.clone(),
        )));
        out.ports.push(stats);
    }
    // A socket systemd opened (edgellm-modbus.socket, for port 502 under a unit without
    // capabilities) wins over binding `modbus.tcp` ourselves, and needs no `modbus.tcp`.
    let listener = match super::activation::tcp_listener("modbus") {
        Some(Ok(l)) => {
            let at = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
            tracing::info!(addr = %at, "Modbus TCP on the socket systemd passed");
            Some(l)
        }
        Some(Err(e)) => return Err(DaemonError::Config(format!("Modbus TCP: {e}"))),
        None => match cfg.modbus.tcp {
            Some(addr) => {
                Some(server::bind_tcp(addr).map_err(|e| DaemonError::Config(e.to_string()))?)
            }
            None => None,
        },
    };
    if let Some(listener) = listener {
        let addr = listener
            .local_addr()
            .map_or_else(|_| "activated socket".to_owned(), |a| a.to_string());
        let stats = Arc::new(PortStats::new(addr, "modbus-tcp"));
        let mc = ModbusConfig {
            unit_id: u8::try_from(cfg.modbus.unit_id).unwrap_or(1),
            ..base
        };
        out.tasks.push(tokio::spawn(server::serve_tcp_listener(
            listener,
            mc,
            handle.clone(),
            Arc::clone(&stats),
            stop.clone(),
        )));
        out.ports.push(stats);
    }
    Ok(out)
}

/// The formats of `modbus.formats`, in order, laid out as registers: a schema whose typed
/// properties do not fit the typed block is refused here, at start.
pub fn typed_formats(cfg: &Config) -> Result<Arc<[Typed]>, String> {
    if cfg.modbus.formats.is_empty() {
        return Ok(Arc::from([]));
    }
    let shapes = cfg.formats().map_err(|e| e.to_string())?;
    cfg.modbus
        .formats
        .iter()
        .map(|name| {
            let shape = shapes
                .get(name)
                .ok_or_else(|| format!("modbus.formats: {name:?} is not a configured format"))?;
            Typed::of(name, shape).map_err(|e| format!("modbus.formats: {e}"))
        })
        .collect()
}
