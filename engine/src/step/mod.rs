//! The decode step of the whole model on the device: the plan (shapes, formats, tiles, checked
//! on the host), the weights on the device, and the engine that binds every launch once and runs
//! them per token, eagerly or as one CUDA graph.

pub mod engine;
pub mod plan;
pub mod weights;

pub use engine::{Engine, Profile, Stage};
pub use plan::{Formats, StepPlan};
pub use weights::{ModelOnDevice, SyntheticPleTable};
