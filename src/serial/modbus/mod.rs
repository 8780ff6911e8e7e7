//! Modbus RTU and TCP: a PLC with a Modbus master writes a prompt into holding registers and
//! reads the answer back, with no custom code on the PLC.
//!
//! [`map`] is the register map (a mailbox), pure and tested without a port; [`server`] serves
//! it with tokio-modbus over a serial port (RTU, reopened when it goes away) and over TCP,
//! where [`tcp_guard`] answers a request longer than the protocol allows before tokio-modbus
//! would drop the connection over it; [`typed`] lays a configured answer format out as
//! registers (a choice's index, a schema's numbers, booleans and enums). The map is documented
//! in [`map`]'s module docs and in `docs/serial.md`.

pub mod map;
pub mod server;
pub mod tcp_guard;
pub mod typed;

pub use map::{Exception, Mailbox, MailboxConfig};
pub use server::{ModbusConfig, RtuSettings, ServeError, serve_rtu, serve_tcp};
