//! QoS scenario and model tests.

mod golden;
mod model;
