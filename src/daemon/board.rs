//! Applying `model.board`: the CPUs the engine is pinned to, the kernel path checked against
//! the one this CPU runs, and the memory the daemon will hold checked against the profile's
//! budget before anything big is allocated (refused with the numbers, instead of an OOM kill
//! in the middle of a long conversation: KV caches are zeroed pages, backed only as the
//! positions fill).

use super::config::Config;
use crate::board::Profile;
use crate::board::cpu::format_cpu_list;
use crate::engine::{EngineConfig, Footprint};
use crate::model::Model;

/// The profile's CPUs this process may run on (empty: do not pin). CPUs the machine (or the
/// cgroup, or `taskset`) does not give us are left out, with a warning: a profile is for a
/// board, and the daemon should still serve where it is not quite that board.
pub fn usable_cpus(p: &Profile) -> Vec<usize> {
    let want = p.cpu_list();
    if want.is_empty() {
        return want;
    }
    let allowed = match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => set,
        Err(e) => {
            tracing::warn!(
                "board {}: cannot read this process's CPUs ({e}): threads not pinned",
                p.name
            );
            return Vec::new();
        }
    };
    let usable: Vec<usize> = want
        .iter()
        .copied()
        .filter(|&c| allowed.is_set(c).unwrap_or(false))
        .collect();
    if usable.is_empty() {
        tracing::warn!(
            "board {}: none of its CPUs {} is available to this process: threads not pinned",
            p.name,
            format_cpu_list(&want)
        );
    } else if usable.len() < want.len() {
        tracing::warn!(
            "board {}: CPUs {} of {} are available to this process: threads pinned to those",
            p.name,
            format_cpu_list(&usable),
            format_cpu_list(&want)
        );
    }
    usable
}

/// A warning when the kernel path running is not one the board's CPU would run (a profile for
/// another board, an emulator's CPU model, or `EDGELLM_KERNELS` forcing a slower one); a faster
/// path of the same family is only logged.
pub fn check_kernels(p: &Profile, running: &str) {
    let faster = kernels_neon::Path::parse(running)
        .ok()
        .zip(kernels_neon::Path::parse(&p.kernels).ok())
        .is_some_and(|(r, want)| r.includes(want));
    if faster && p.kernels != running {
        tracing::info!(
            "board {} names kernel path {}; this CPU runs the faster {running}",
            p.name,
            p.kernels
        );
    } else if p.kernels != running {
        tracing::warn!(
            "board {} expects kernel path {}, but this CPU runs {running}: decoding speed will \
             not be the board's",
            p.name,
            p.kernels
        );
    }
}

/// KV caches the daemon may hold at once: a scratch session for each answer of a batch, and
/// with a state directory the resident sessions `state.ram_budget` allows (at least one).
pub fn kv_sessions(cfg: &Config, kv_per_session: u64) -> u64 {
    let batch = cfg.engine_config().max_batch as u64;
    match &cfg.store_config() {
        None => batch,
        Some(s) => batch + s.max_resident(kv_per_session),
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// Checks weights + KV caches + activations against the profile's memory budget; the refusal
/// names every part and the budget, in MiB and bytes.
pub fn check_budget(
    p: &Profile,
    cfg: &Config,
    model: &Model,
    engine: &EngineConfig,
) -> Result<(), String> {
    let over = || format!("board {}: the memory needed overflows 64 bits", p.name);
    let f = Footprint::of(model, engine).ok_or_else(over)?;
    let sessions = kv_sessions(cfg, f.kv_per_session);
    let kv = f.kv_per_session.checked_mul(sessions).ok_or_else(over)?;
    let total = [f.weights, kv, f.arena]
        .iter()
        .try_fold(0u64, |s, &x| s.checked_add(x))
        .ok_or_else(over)?;
    let budget = p.memory_budget();
    if total <= budget {
        tracing::info!(
            board = %p.name,
            weights_mib = f.weights >> 20,
            kv_mib = kv >> 20,
            kv_sessions = sessions,
            arena_mib = f.arena >> 20,
            budget_mib = budget >> 20,
            "memory within the board's budget: {} of {}",
            mib(total),
            mib(budget)
        );
        return Ok(());
    }
    Err(format!(
        "board {}: the daemon would need {} ({total} bytes), more than the board's memory \
         budget of {} ({budget} bytes, {}): weights {} ({} bytes) + KV caches {} ({sessions} \
         session(s) x {} at model.ctx {}, kv_type {}; {kv} bytes) + activations {} ({} bytes); \
         lower model.ctx, model.max_batch, state.ram_budget or model.kv_type, or use a smaller model",
        p.name,
        mib(total),
        mib(budget),
        p.memory_note,
        mib(f.weights),
        f.weights,
        mib(kv),
        mib(f.kv_per_session),
        engine.n_ctx,
        engine.kv_type,
        mib(f.arena),
        f.arena,
    ))
}

/// One line for `--check` and the log: what the profile sets.
pub fn summary(cfg: &Config) -> Option<String> {
    let p = cfg.board()?;
    let threads = cfg.engine_config().threads;
    let source = if cfg.model.threads.is_some() {
        "model.threads"
    } else if p.threads.is_some() {
        "the board"
    } else {
        "every core"
    };
    let cpus = p.cpus.as_deref().unwrap_or("not pinned");
    Some(format!(
        "{}: {threads} threads ({source}), CPUs {cpus}, kernel path {} expected (this CPU: {}), \
         memory budget {} MiB, serial {} at {} baud",
        p.name,
        p.kernels,
        kernels_neon::Path::best(),
        p.memory_budget_mib,
        p.serial.path,
        p.serial.baud
    ))
}
