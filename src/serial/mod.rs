//! The serial front ends: a PLC's line protocol, binary frames for RS-485, Modbus RTU/TCP and a
//! technician's console, all feeding the one service queue.
//!
//! Each mode is a protocol core that does no I/O ([`core::Core`]: bytes in, actions out
//! through an [`core::Env`]), tested without a tty; [`port`] opens and configures a tty
//! (termios, RS-485), [`driver`] is the thin tokio loop that joins a port, a core and the
//! service, and reopens a port that went away. Modbus is served by tokio-modbus around its own
//! pure register map ([`modbus`]).

pub mod console;
pub mod core;
pub mod driver;
pub mod frame;
pub mod line;
pub mod modbus;
pub mod port;
pub mod stats;
