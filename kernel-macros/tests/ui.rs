//! UI tests for `#[kernel]`: kernels that must compile (and whose generated API is checked when they
//! run), and mistakes that must be reported at their own span with a clear message.
//!
//! After changing a message on purpose, regenerate the expected output with
//! `TRYBUILD=overwrite cargo test -p kernel-macros --test ui` and read every `.stderr` it rewrites.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
