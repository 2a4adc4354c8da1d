//! `config.json` from any bytes: [`flashnext::fuzz_targets::config`].
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    flashnext::fuzz_targets::config(data);
});
