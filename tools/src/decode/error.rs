//! The decode binary's errors: any error of the engine's loaders (config, checkpoint, weights)
//! passes through boxed, with its own message; the binary's own checks are [`DecodeError`]s.

use std::fmt;

/// Every fallible step of the binary returns this: the message is what the user sees.
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A problem the binary found itself (a bad option, an id past the vocabulary, a prompt past the
/// context), described in full.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DecodeError {}

/// `Err(DecodeError(msg))`, boxed.
pub fn fail<T>(msg: impl Into<String>) -> Result<T> {
    Err(Box::new(DecodeError(msg.into())))
}
