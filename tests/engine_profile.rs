//! The per-op profiler on synthetic models: every op of the forward pass is counted the
//! expected number of times, the op times are disjoint parts of the wall time, and turning
//! profiling on changes no output bit.

use edgellm::engine::{Engine, EngineConfig, GenParams, Sampler, SamplingParams};
use edgellm::gguf::GgmlType;
use edgellm::kv::KvType;
use edgellm::model::Model;
use edgellm::model::synth::{SynthSpec, synth_model};
use edgellm::runtime::Op;
use std::sync::Arc;

fn engine(model: &Arc<Model>, threads: usize, chunk: usize) -> Engine {
    let cfg = EngineConfig {
        n_ctx: 96,
        chunk,
        threads,
        kv_type: KvType::F16,
        max_batch: 1,
    };
    Engine::new(Arc::clone(model), cfg).expect("engine")
}

fn prompt(n: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 11) % 300) as u32).collect()
}

const MATRICES: [Op; 7] = [
    Op::AttnQ,
    Op::AttnK,
    Op::AttnV,
    Op::AttnOutput,
    Op::FfnGate,
    Op::FfnUp,
    Op::FfnDown,
];

#[test]
fn every_op_is_counted_once_per_layer_and_pass_and_fits_in_the_wall_time() {
    let spec = SynthSpec {
        tied: false,
        n_layer: 3,
        ..Default::default()
    };
    let model = Arc::new(synth_model(&spec));
    let nl = spec.n_layer as u64;
    for threads in [1, 2] {
        let mut e = engine(&model, threads, 16);
        let mut s = e.new_session();
        e.set_profiling(true);

        // 40 tokens in chunks of 16: three forward passes, logits after the last only.
        e.feed(&mut s, &prompt(40)).unwrap();
        let p = e.profile().clone();
        let passes = 3;
        let calls = |op| p.get(op).calls;
        for op in MATRICES {
            assert_eq!(
                calls(op),
                nl * passes,
                "{threads}t: {op:?} per layer and chunk"
            );
        }
        let wq = model.layer(0).wq.bytes() as u64;
        assert_eq!(p.get(Op::AttnQ).bytes, wq * nl * passes);
        assert_eq!(calls(Op::Output), 1, "logits once, after the last chunk");
        assert_eq!(
            p.get(Op::Output).bytes,
            model.output().bytes() as u64,
            "lm head bytes"
        );
        assert_eq!(calls(Op::Embed), passes);
        for op in [Op::Attention, Op::Rope, Op::KvStore, Op::Glu] {
            assert_eq!(calls(op), nl * passes, "{threads}t: {op:?}");
        }
        assert_eq!(calls(Op::Residual), 2 * nl * passes);
        assert_eq!(calls(Op::RmsNorm), 2 * nl * passes + 1, "+ the output norm");
        assert_eq!(
            calls(Op::Quantize),
            4 * nl * passes + 1,
            "+ the lm head input"
        );
        assert_eq!(calls(Op::Sample), 0, "feed does not sample");
        for (op, st) in p.ops() {
            if op != Op::Sample {
                assert!(st.ns > 0, "{threads}t: {op:?} has no time");
            }
        }
        assert_eq!(p.tokens, 40);
        let (ops, wall) = (p.ops_ns(), p.wall_ns);
        assert!(
            ops <= wall,
            "{threads}t: ops {ops} ns exceed the wall {wall} ns"
        );
        assert!(
            ops * 2 >= wall,
            "{threads}t: ops {ops} ns are under half the wall {wall} ns: an op is not timed"
        );

        // Decoding: one pass per token, logits every time; counters restart at reset.
        e.profile_mut().reset();
        for t in 0..5 {
            e.feed(&mut s, &[t + 3]).unwrap();
        }
        let p = e.profile();
        for op in MATRICES {
            assert_eq!(
                p.get(op).calls,
                nl * 5,
                "{threads}t: {op:?} per decoded token"
            );
        }
        assert_eq!(p.get(Op::Output).calls, 5);
        assert_eq!(p.tokens, 5);

        // Generate times its sampler, inside the wall time.
        e.profile_mut().reset();
        let mut s = e.new_session();
        let mut sampler = Sampler::new(SamplingParams::default(), spec.n_vocab);
        let params = GenParams {
            max_tokens: 6,
            top_logits: 0,
        };
        let out = e
            .generate(
                &mut s,
                &prompt(8),
                &params,
                &mut sampler,
                &|_| false,
                &mut |_| true,
            )
            .unwrap();
        let p = e.profile();
        assert_eq!(p.get(Op::Sample).calls, out.generated.len() as u64);
        assert!(p.ops_ns() <= p.wall_ns);

        // Off: nothing more is recorded.
        e.set_profiling(false);
        let before = e.profile().clone();
        e.feed(&mut s, &[4]).unwrap();
        assert_eq!(e.profile().ops_ns(), before.ops_ns());
        assert_eq!(e.profile().get(Op::AttnQ), before.get(Op::AttnQ));
    }
}

#[test]
fn profiling_changes_no_output_bit() {
    for spec in [
        SynthSpec::default(),
        SynthSpec {
            weight_type: GgmlType::Q4_1,
            tied: false,
            seed: 3,
            ..Default::default()
        },
        SynthSpec {
            arch: "qwen2",
            biases: true,
            n_head_kv: 1,
            weight_type: GgmlType::Q8_0,
            seed: 9,
            ..Default::default()
        },
    ] {
        let model = Arc::new(synth_model(&spec));
        let run = |on: bool| {
            let mut e = engine(&model, 2, 8);
            e.set_profiling(on);
            let mut s = e.new_session();
            let logits: Vec<u32> = e
                .feed(&mut s, &prompt(20))
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            let mut s = e.new_session();
            let mut sampler = Sampler::new(SamplingParams::default(), spec.n_vocab);
            let params = GenParams {
                max_tokens: 24,
                top_logits: 0,
            };
            let out = e
                .generate(
                    &mut s,
                    &prompt(20),
                    &params,
                    &mut sampler,
                    &|_| false,
                    &mut |_| true,
                )
                .unwrap();
            assert_eq!(e.profile().get(Op::FfnDown).calls > 0, on);
            (logits, out.generated)
        };
        let (off, on) = (run(false), run(true));
        assert_eq!(off.0, on.0, "{spec:?}: logits differ with profiling on");
        assert_eq!(
            off.1, on.1,
            "{spec:?}: greedy tokens differ with profiling on"
        );
    }
}
