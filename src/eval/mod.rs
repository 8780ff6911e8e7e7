//! Answer quality, measured as llama.cpp's `llama-perplexity` measures it: the perplexity of a
//! model over a text, and the KL divergence of its next-token distributions from a reference
//! model's (a quantization against the file it was made from).
//!
//! The text is split into windows of `n_ctx` tokens, each evaluated from an empty cache (the
//! first token replaced by BOS when the model adds one); only the second half of a window is
//! scored, so every scored token has at least `n_ctx / 2` tokens of context. [`windows`] makes
//! the tokens fed, [`score`] has the arithmetic and [`topk`] the file of a reference model's
//! logits that `--kl-divergence` compares with.
//!
//! Nothing here runs a model: the CLI feeds the windows to the engine and hands each scored
//! position's logits to [`score`].

pub mod score;
pub mod topk;

use sha2::{Digest, Sha256};

/// The first position of a window whose logits are scored (`n_ctx / 2`, as llama.cpp): its
/// prediction of the next token is the first that counts.
pub fn first_scored(n_ctx: usize) -> usize {
    n_ctx / 2
}

/// Positions scored per window: `first_scored..n_ctx - 1`, each predicting the next token of
/// the window (the last token is never predicted from inside it).
pub fn scored_per_window(n_ctx: usize) -> usize {
    n_ctx.saturating_sub(1 + first_scored(n_ctx))
}

/// The tokens fed for the first `n_windows` windows of `n_ctx` tokens of `tokens`, window after
/// window, with `bos` (the model adds one) in place of each window's first token, as
/// llama-perplexity feeds them. The caller checks that `tokens` holds that many windows.
pub fn windows(tokens: &[u32], n_ctx: usize, n_windows: usize, bos: Option<u32>) -> Vec<u32> {
    let mut fed = tokens[..n_windows * n_ctx].to_vec();
    if let Some(bos) = bos {
        for w in fed.chunks_exact_mut(n_ctx) {
            w[0] = bos;
        }
    }
    fed
}

/// SHA-256 of the token ids fed (each a little-endian u32): what a saved reference's header
/// holds, so that a comparison over another text, context or tokenizer is refused.
pub fn tokens_checksum(fed: &[u32]) -> [u8; 32] {
    let mut h = Sha256::new();
    for t in fed {
        h.update(t.to_le_bytes());
    }
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_of_512_scores_the_255_predictions_of_its_second_half() {
        assert_eq!(first_scored(512), 256);
        assert_eq!(scored_per_window(512), 255);
        assert_eq!(scored_per_window(3), 1);
        assert_eq!(scored_per_window(1), 0);
    }

    #[test]
    fn bos_replaces_the_first_token_of_every_window_and_only_that() {
        let tokens: Vec<u32> = (10..20).collect();
        assert_eq!(
            windows(&tokens, 4, 2, Some(1)),
            [1, 11, 12, 13, 1, 15, 16, 17]
        );
        assert_eq!(
            windows(&tokens, 4, 2, None),
            [10, 11, 12, 13, 14, 15, 16, 17]
        );
        assert_ne!(
            tokens_checksum(&windows(&tokens, 4, 2, Some(1))),
            tokens_checksum(&windows(&tokens, 4, 2, None))
        );
    }
}
