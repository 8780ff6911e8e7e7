//! The MQTT front end: [`contract`] turns topics and JSON into service requests and events back
//! (pure); the client loop that owns the connection comes with the daemon.

pub mod contract;
