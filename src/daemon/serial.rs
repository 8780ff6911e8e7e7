//! The `[[serial]]` ports of the configuration, each with its protocol core, on the daemon's
//! runtime.

use super::config::{Config, Parity, SerialConfig, SerialFlow, SerialMode};
use super::serve::DaemonError;
use crate::serial::console::{ConsoleConfig, ConsoleCore};
use crate::serial::core::Core;
use crate::serial::driver::{self, Context, Spec};
use crate::serial::frame::{FrameConfig, FrameCore};
use crate::serial::line::{LineConfig, LineCore};
use crate::serial::port::{self, Settings};
use crate::serial::stats::PortStats;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Room on a line beyond the prompt: the command word, `session=<64 bytes>`, a checksum.
const LINE_OVERHEAD: usize = 96;

/// A technician's console line: a question typed by hand.
const CONSOLE_LINE: usize = 1024;

/// The line settings of a configured port.
pub fn settings(s: &SerialConfig) -> Settings {
    Settings {
        baud: s.baud,
        data_bits: s.data_bits as u8,
        parity: match s.parity {
            Parity::None => port::Parity::None,
            Parity::Even => port::Parity::Even,
            Parity::Odd => port::Parity::Odd,
        },
        stop_bits: s.stop_bits as u8,
        flow: match s.flow {
            SerialFlow::None => port::Flow::None,
            SerialFlow::RtsCts => port::Flow::RtsCts,
            SerialFlow::XonXoff => port::Flow::XonXoff,
        },
        rs485: s.rs485,
    }
}

pub fn mode_name(m: SerialMode) -> &'static str {
    match m {
        SerialMode::Line => "line",
        SerialMode::Frame => "frame",
        SerialMode::Modbus => "modbus",
        SerialMode::Console => "console",
    }
}

/// The protocol core of a port of mode `line`, `frame` or `console`.
fn core_for(cfg: &Config, s: &SerialConfig) -> Result<Box<dyn Core>, DaemonError> {
    let l = &cfg.limits;
    let prompt = usize::try_from(l.max_prompt_bytes).unwrap_or(usize::MAX);
    match s.mode {
        SerialMode::Line => Ok(Box::new(LineCore::new(LineConfig {
            max_line: prompt.saturating_add(LINE_OVERHEAD),
            max_tokens: l.max_tokens,
            default_tokens: l.max_tokens.min(256),
            timeout: Some(l.request_timeout()),
        }))),
        SerialMode::Frame => FrameCore::new(FrameConfig {
            max_tokens: l.max_tokens,
            default_tokens: l.max_tokens.min(256),
            timeout: Some(l.request_timeout()),
            ..FrameConfig::default()
        })
        .map(|c| Box::new(c) as Box<dyn Core>)
        .map_err(|e| DaemonError::Config(format!("{}: {e}", s.path.display()))),
        SerialMode::Console => ConsoleCore::new(ConsoleConfig {
            max_line: CONSOLE_LINE,
            max_tokens: l.max_tokens.min(256),
            timeout: Some(l.request_timeout()),
        })
        .map(|c| Box::new(c) as Box<dyn Core>)
        .map_err(|e| DaemonError::Config(format!("{}: {e}", s.path.display()))),
        // `start` hands Modbus ports to the Modbus server (daemon/modbus.rs), never here.
        SerialMode::Modbus => Err(DaemonError::Config(format!(
            "{}: a Modbus port has no line protocol core",
            s.path.display()
        ))),
    }
}

/// Starts a loop for each configured port but the Modbus ones; returns their tasks and their
/// status.
pub fn start(
    cfg: &Config,
    ctx: &Context,
    stop: &watch::Receiver<bool>,
) -> Result<(Vec<JoinHandle<()>>, Vec<Arc<PortStats>>), DaemonError> {
    let mut tasks = Vec::new();
    let mut stats = Vec::new();
    for s in cfg.serial.iter().filter(|s| s.mode != SerialMode::Modbus) {
        let core = core_for(cfg, s)?;
        let st = Arc::new(PortStats::new(
            s.path.display().to_string(),
            mode_name(s.mode),
        ));
        let spec = Spec {
            path: s.path.clone(),
            settings: settings(s),
        };
        tasks.push(tokio::spawn(driver::run(
            spec,
            core,
            ctx.clone(),
            Arc::clone(&st),
            stop.clone(),
        )));
        stats.push(st);
    }
    Ok((tasks, stats))
}
