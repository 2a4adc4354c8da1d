//! The engine's error type: every failure a user can meet, said in words that name the cause.

use std::fmt;

use kernel_dsl::{LaunchError, SpecializeError};

#[derive(Debug)]
pub enum Error {
    /// No usable GPU: no driver library, no device, or a device this build has no target for.
    NoDevice(String),
    /// NVRTC could not be found or loaded.
    NvrtcMissing(String),
    /// NVRTC rejected a kernel; the log and the generated lines it points at.
    Compile {
        kernel: String,
        log: String,
        excerpt: String,
    },
    /// A CUDA driver call failed.
    Driver {
        during: String,
        error: cudarc::driver::DriverError,
    },
    Specialize(SpecializeError),
    Launch(LaunchError),
    /// A buffer is too small for what was asked of it.
    Buffer(String),
    /// A token would need more context than the caches were sized for at load: `needed` tokens
    /// of cache against `capacity`.
    ContextTooLong {
        needed: usize,
        capacity: usize,
    },
    Io {
        path: String,
        error: std::io::Error,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoDevice(m) => write!(f, "no usable CUDA device: {m}"),
            Error::NvrtcMissing(m) => write!(f, "NVRTC is not available: {m}"),
            Error::Compile { kernel, log, excerpt } => {
                write!(f, "NVRTC could not compile kernel {kernel}:\n{log}")?;
                if !excerpt.is_empty() {
                    write!(f, "\nin the generated source:\n{excerpt}")?;
                }
                Ok(())
            }
            Error::Driver { during, error } => write!(f, "CUDA driver error while {during}: {error}"),
            Error::Specialize(e) => e.fmt(f),
            Error::Launch(e) => e.fmt(f),
            Error::Buffer(m) => f.write_str(m),
            Error::ContextTooLong { needed, capacity } => write!(
                f,
                "the context needs {needed} tokens of cache but it was sized for {capacity} at load (load with a longer context)"
            ),
            Error::Io { path, error } => write!(f, "{path}: {error}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Driver { error, .. } => Some(error),
            Error::Specialize(e) => Some(e),
            Error::Launch(e) => Some(e),
            Error::Io { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl From<SpecializeError> for Error {
    fn from(e: SpecializeError) -> Error {
        Error::Specialize(e)
    }
}

impl From<LaunchError> for Error {
    fn from(e: LaunchError) -> Error {
        Error::Launch(e)
    }
}

/// Attaches what was being done to a driver error.
pub(crate) trait DriverContext<T> {
    fn during(self, what: &str) -> Result<T, Error>;
}

impl<T> DriverContext<T> for Result<T, cudarc::driver::DriverError> {
    fn during(self, what: &str) -> Result<T, Error> {
        self.map_err(|error| Error::Driver { during: what.to_owned(), error })
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
