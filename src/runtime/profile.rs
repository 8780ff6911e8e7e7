//! Per-operation timing of the forward pass (`edgellm bench --profile`).
//!
//! The table is a fixed array indexed by [`Op`], part of the arena: turning profiling on
//! allocates nothing and decoding still allocates nothing. When off, each timed op costs one
//! branch on a bool (no clock read). Times are wall time on the calling thread: every op that
//! uses the pool waits for its workers, so the wall time of the call is the op's cost.

use std::time::Instant;

/// A timed operation. Matrix products have one entry per tensor kind, summed over layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Embed,
    RmsNorm,
    Quantize,
    AttnQ,
    AttnK,
    AttnV,
    Rope,
    KvStore,
    Attention,
    AttnOutput,
    Residual,
    FfnGate,
    FfnUp,
    /// The gated unit of the FFN (SwiGLU or GeGLU).
    Glu,
    FfnDown,
    Output,
    Sample,
}

impl Op {
    /// Every op, in forward-pass order (the order of the table).
    pub const ALL: [Op; 17] = [
        Op::Embed,
        Op::RmsNorm,
        Op::Quantize,
        Op::AttnQ,
        Op::AttnK,
        Op::AttnV,
        Op::Rope,
        Op::KvStore,
        Op::Attention,
        Op::AttnOutput,
        Op::Residual,
        Op::FfnGate,
        Op::FfnUp,
        Op::Glu,
        Op::FfnDown,
        Op::Output,
        Op::Sample,
    ];

    /// The name shown in tables and charts (GGUF tensor names for the matrices).
    pub fn name(self) -> &'static str {
        match self {
            Op::Embed => "embed",
            Op::RmsNorm => "rms_norm",
            Op::Quantize => "quantize_act",
            Op::AttnQ => "attn_q",
            Op::AttnK => "attn_k",
            Op::AttnV => "attn_v",
            Op::Rope => "rope",
            Op::KvStore => "kv_store",
            Op::Attention => "attention",
            Op::AttnOutput => "attn_output",
            Op::Residual => "residual_add",
            Op::FfnGate => "ffn_gate",
            Op::FfnUp => "ffn_up",
            Op::Glu => "glu",
            Op::FfnDown => "ffn_down",
            Op::Output => "output",
            Op::Sample => "sample",
        }
    }

    /// A product with a weight matrix (its bytes streamed are recorded).
    pub fn is_matrix(self) -> bool {
        matches!(
            self,
            Op::AttnQ
                | Op::AttnK
                | Op::AttnV
                | Op::AttnOutput
                | Op::FfnGate
                | Op::FfnUp
                | Op::FfnDown
                | Op::Output
        )
    }
}

const N_OPS: usize = Op::ALL.len();

/// Accumulated cost of one op.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpStat {
    pub calls: u64,
    pub ns: u64,
    /// Weight bytes read (matrix products only).
    pub bytes: u64,
}

/// Accumulated per-op times since the last [`Profile::reset`].
#[derive(Clone, Debug, Default)]
pub struct Profile {
    enabled: bool,
    ops: [OpStat; N_OPS],
    /// Wall time of the timed work: every `Engine::feed`, plus what was recorded with
    /// [`Profile::record_outside`]. The ops are disjoint intervals inside it.
    pub wall_ns: u64,
    /// Tokens fed.
    pub tokens: u64,
}

impl Profile {
    pub fn enabled(&self) -> bool {
        self.enabled
    }
    pub fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
    }

    /// Zeroes every counter (keeps the on/off state).
    pub fn reset(&mut self) {
        *self = Profile {
            enabled: self.enabled,
            ..Default::default()
        };
    }

    /// Starts timing an op: `None` (no clock read) when profiling is off.
    #[inline]
    pub fn start(&self) -> Option<Instant> {
        if self.enabled {
            Some(Instant::now())
        } else {
            None
        }
    }

    /// Ends the op started at `t0`.
    #[inline]
    pub fn stop(&mut self, op: Op, t0: Option<Instant>) {
        self.stop_bytes(op, t0, 0);
    }

    /// Ends the op started at `t0`, which read `bytes` of weights.
    #[inline]
    pub fn stop_bytes(&mut self, op: Op, t0: Option<Instant>, bytes: usize) {
        if let Some(t0) = t0 {
            let s = &mut self.ops[op as usize];
            s.calls += 1;
            s.ns += t0.elapsed().as_nanos() as u64;
            s.bytes += bytes as u64;
        }
    }

    /// Records one product over several tensors fused into one (`parts`: each tensor's op and
    /// bytes): the time is shared out in proportion to the bytes, which is how a product that
    /// streams its weights spends it, and each op still counts one call.
    pub fn stop_fused(&mut self, parts: &[(Op, usize)], t0: Option<Instant>) {
        if let Some(t0) = t0 {
            let ns = t0.elapsed().as_nanos() as u64;
            let total = parts.iter().map(|p| p.1 as u64).sum::<u64>().max(1);
            for &(op, bytes) in parts {
                let s = &mut self.ops[op as usize];
                s.calls += 1;
                s.ns += ns * bytes as u64 / total;
                s.bytes += bytes as u64;
            }
        }
    }

    /// Runs `f`, timed as `op`: what a timed op of the forward pass is written as, so that
    /// the pass reads as its math. Generic, so nothing is boxed or allocated; when profiling
    /// is off it costs the branch of [`Profile::start`].
    #[inline]
    pub fn timed<R>(&mut self, op: Op, f: impl FnOnce() -> R) -> R {
        self.timed_bytes(op, 0, f)
    }

    /// As [`Profile::timed`], for a product that read `bytes` of weights.
    #[inline]
    pub fn timed_bytes<R>(&mut self, op: Op, bytes: usize, f: impl FnOnce() -> R) -> R {
        let t0 = self.start();
        let r = f();
        self.stop_bytes(op, t0, bytes);
        r
    }

    /// As [`Profile::timed`], for one product over several fused tensors
    /// ([`Profile::stop_fused`]).
    #[inline]
    pub fn timed_fused<R>(&mut self, parts: &[(Op, usize)], f: impl FnOnce() -> R) -> R {
        let t0 = self.start();
        let r = f();
        self.stop_fused(parts, t0);
        r
    }

    /// Records an op timed by the caller outside the forward pass (sampling): it counts
    /// towards the wall time too, so the ops stay a part of the wall.
    pub fn record_outside(&mut self, op: Op, ns: u64) {
        if self.enabled {
            let s = &mut self.ops[op as usize];
            s.calls += 1;
            s.ns += ns;
            self.wall_ns += ns;
        }
    }

    pub fn get(&self, op: Op) -> OpStat {
        self.ops[op as usize]
    }

    /// Every op with its counters, in [`Op::ALL`] order.
    pub fn ops(&self) -> impl Iterator<Item = (Op, OpStat)> + '_ {
        Op::ALL.iter().map(|&op| (op, self.ops[op as usize]))
    }

    /// Sum of the op times.
    pub fn ops_ns(&self) -> u64 {
        self.ops.iter().map(|s| s.ns).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_table_is_indexed_by_discriminant() {
        for (i, op) in Op::ALL.iter().enumerate() {
            assert_eq!(*op as usize, i, "{op:?} out of order in Op::ALL");
        }
    }

    #[test]
    fn off_records_nothing_and_reset_keeps_the_switch() {
        let mut p = Profile::default();
        let t = p.start();
        assert!(t.is_none());
        p.stop(Op::Rope, t);
        p.record_outside(Op::Sample, 5);
        assert_eq!(p.ops_ns(), 0);
        assert_eq!(p.get(Op::Rope).calls, 0);

        p.set_enabled(true);
        let t = p.start();
        p.stop_bytes(Op::FfnUp, t, 100);
        p.record_outside(Op::Sample, 7);
        assert_eq!(p.get(Op::FfnUp).calls, 1);
        assert_eq!(p.get(Op::FfnUp).bytes, 100);
        assert_eq!(p.get(Op::Sample).ns, 7);
        assert_eq!(p.wall_ns, 7);
        assert_eq!(
            p.timed_bytes(Op::FfnUp, 50, || 3),
            3,
            "returns what it timed"
        );
        assert_eq!(p.get(Op::FfnUp).calls, 2);
        assert_eq!(p.get(Op::FfnUp).bytes, 150);
        p.timed_fused(&[(Op::AttnQ, 1), (Op::AttnK, 3)], || ());
        assert_eq!((p.get(Op::AttnQ).calls, p.get(Op::AttnK).bytes), (1, 3));
        p.reset();
        assert!(p.enabled());
        assert_eq!(p.get(Op::FfnUp), OpStat::default());
        assert_eq!(p.wall_ns, 0);
    }
}
