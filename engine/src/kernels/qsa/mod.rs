//! QSA sparse attention on the device: the per-token norms, RoPE and cache appends after the
//! projections ([`prepare`]), the block scores of the indexer ([`block_scores`]), the
//! deterministic top-k over them ([`top_blocks`] in one block, [`top_blocks_grid`] over many
//! SMs), and the gated decode attention through the selection ([`attention`]) with its combine of
//! the splits ([`combine`]).

pub mod attention;
pub mod block_scores;
pub mod combine;
pub mod prepare;
pub mod top_blocks;
pub mod top_blocks_grid;
