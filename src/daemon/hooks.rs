//! Test hooks, from `EDGELLM_TEST_HOOK`: the daemon tests reproduce a hung engine and a crash
//! at an exact point with them, on the real binary. Compiled only with the `test-hooks`
//! feature, which `cargo test` turns on (Cargo.toml's dev-dependency on this crate) and release
//! builds, the .deb and the Yocto recipe do not: firmware cannot be made to stall or kill
//! itself by its environment (scripts/check-no-test-hooks.sh checks the packaged binary). A
//! test build that finds the variable set says so loudly in its log.
//!
//! `EDGELLM_TEST_HOOK=stall_ms=N` pauses every answer N ms before it starts (the worker makes
//! no progress meanwhile); `kill_after_journal=ID` sends the daemon SIGKILL right after the
//! answer to request ID is journaled, before it is published or acknowledged.

use std::time::Duration;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TestHooks {
    pub stall: Option<Duration>,
    pub kill_after_journal: Option<String>,
}

impl TestHooks {
    pub fn from_env() -> TestHooks {
        let Ok(spec) = std::env::var("EDGELLM_TEST_HOOK") else {
            return TestHooks::default();
        };
        let hooks = TestHooks::parse(&spec);
        tracing::warn!(?hooks, "EDGELLM_TEST_HOOK is set: test hooks are active");
        hooks
    }

    fn parse(spec: &str) -> TestHooks {
        let mut h = TestHooks::default();
        for item in spec.split(',').filter(|s| !s.is_empty()) {
            match item.split_once('=') {
                Some(("stall_ms", v)) if v.parse::<u64>().is_ok() => {
                    h.stall = v.parse().ok().map(Duration::from_millis);
                }
                Some(("kill_after_journal", id)) if !id.is_empty() => {
                    h.kill_after_journal = Some(id.to_owned());
                }
                _ => tracing::warn!(item, "EDGELLM_TEST_HOOK: unknown hook, ignored"),
            }
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_parse_and_unknown_ones_are_ignored() {
        let h = TestHooks::parse("stall_ms=1500,kill_after_journal=r1,nonsense=3,stall_ms=x");
        assert_eq!(h.stall, Some(Duration::from_millis(1500)));
        assert_eq!(h.kill_after_journal.as_deref(), Some("r1"));
        assert_eq!(TestHooks::parse(""), TestHooks::default());
    }
}
