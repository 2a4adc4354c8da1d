//! PLE (the per-layer n-gram embedding): the row ids of the newest token, hashed on the device
//! from a device-side token history ([`ids`]), and the gather of the rows those ids address from
//! a table in mapped host memory ([`gather_bf16`]).

pub mod gather_bf16;
pub mod ids;
