//! QSA sparse attention on the device: the block scores of the indexer ([`block_scores`]) and
//! the deterministic top-k over them ([`top_blocks`]).

pub mod block_scores;
pub mod top_blocks;
