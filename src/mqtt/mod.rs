//! The MQTT front end: [`contract`] turns topics and JSON into service requests and events back
//! (pure); [`core`] holds the delivery rules (pure: fed connacks, messages and events, it
//! returns actions); [`client`] is the tokio loop that owns the connection and executes them;
//! [`failure`] says why a connection failed (pure).

mod ack_order;
pub mod client;
pub mod contract;
pub mod core;
pub mod failure;
pub mod journal;
pub mod link;
