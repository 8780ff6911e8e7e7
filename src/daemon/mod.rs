//! The daemon layer (`edgellm serve`), above the service and the front ends (`mqtt`, `serial`):
//! it reads the [`config`], wires the model, the service worker and the front ends together,
//! applies the board profile, and answers to systemd. Nothing below it knows a configuration file exists; each layer
//! takes its own plain settings struct, which [`Config`]'s getters produce.

mod activation;
pub mod board;
mod broker;
pub mod config;
#[cfg(feature = "embedded-broker")]
mod embedded;
#[cfg(feature = "embedded-broker")]
pub mod embedded_log;
#[cfg(feature = "test-hooks")]
mod hooks;
pub mod modbus;
pub mod notify;
mod refusal;
mod serial;
pub mod serve;
mod status;
pub mod tls;

pub use serve::{DaemonError, serve};

pub use config::{
    Broker, Config, ConfigError, LimitsConfig, LogConfig, ModelConfig, MqttConfig, Origin,
    Overrides, Parity, Protocol, Secret, SerialConfig, SerialFlow, SerialMode, StateConfig,
    TlsConfig, parse_size,
};
