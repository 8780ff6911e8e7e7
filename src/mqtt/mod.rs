//! The MQTT front end: [`contract`] turns topics and JSON into service requests and events back
//! (pure); [`client`] is the tokio loop that owns the connection; [`failure`] says why a
//! connection failed (pure).

mod ack_order;
pub mod client;
pub mod contract;
pub mod failure;
pub mod journal;
pub mod link;
