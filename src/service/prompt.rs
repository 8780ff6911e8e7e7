//! A request's prompt as token ids: the chat template rendered with the messages' contents kept
//! apart as user text (control tokens typed in them stay text), the size bounds, the
//! truncation policy, and the system prompt's prefix that a session store computes once.

use super::{ErrorCode, Prompt, Request, ServiceError};
use crate::tokenizer::{ChatTemplate, Tokenizer};

/// A prompt ready for the engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Built {
    pub ids: Vec<u32>,
    /// Tokens dropped from the front to fit the context.
    pub truncated: usize,
    /// The tokens every conversation with this system prompt begins with (the system turn and
    /// the first user turn's header), for a chat; the prompt may no longer begin with them once
    /// truncated.
    pub system_prefix: Option<Vec<u32>>,
}

/// Bytes of user text in `p` (and the system prompt).
pub fn text_bytes(req: &Request) -> usize {
    let body = match &req.prompt {
        Prompt::Text { text, .. } => text.len(),
        Prompt::Chat(msgs) => msgs.iter().map(|m| m.content.len() + m.role.len()).sum(),
        Prompt::Forget | Prompt::History => 0,
    };
    body + req.system.as_ref().map_or(0, |s| s.len())
}

/// Refuses a prompt with nothing to answer: an empty or whitespace-only raw text, or a chat
/// whose messages are all empty or whitespace (or that has none). A template would wrap such a
/// prompt in its turn markers and the model would answer the markers, at length.
pub fn check(req: &Request) -> Result<(), ServiceError> {
    let blank = match &req.prompt {
        Prompt::Text { text, .. } => text.trim().is_empty(),
        Prompt::Chat(msgs) => msgs.iter().all(|m| m.content.trim().is_empty()),
        Prompt::Forget | Prompt::History => false,
    };
    if blank {
        return Err(ServiceError::new(
            ErrorCode::BadRequest,
            "the prompt is empty or only whitespace: there is nothing to answer",
        ));
    }
    Ok(())
}

/// Tokenizes `req`'s prompt (one that passed [`check`]) for a context of `n_ctx` positions.
/// `template` is the model's chat template (`None` when it has none: a chat is then refused).
pub fn build(
    tok: &Tokenizer,
    template: Option<&ChatTemplate>,
    req: &Request,
    n_ctx: usize,
    max_bytes: usize,
) -> Result<Built, ServiceError> {
    let bytes = text_bytes(req);
    if bytes > max_bytes {
        return Err(ServiceError::new(
            ErrorCode::TooLarge,
            format!("the prompt is {bytes} bytes; at most {max_bytes} are accepted"),
        ));
    }
    let (mut ids, system_prefix) = match &req.prompt {
        Prompt::Text { text, special } => {
            if req.system.is_some() {
                return Err(ServiceError::new(
                    ErrorCode::BadRequest,
                    "a system prompt needs a chat (messages), not a raw prompt",
                ));
            }
            (tok.encode(text, true, *special), None)
        }
        Prompt::Forget | Prompt::History => {
            return Err(ServiceError::new(
                ErrorCode::BadRequest,
                "a session reset or history has no prompt to build",
            ));
        }
        Prompt::Chat(messages) => {
            let template = template.ok_or_else(|| {
                ServiceError::new(
                    ErrorCode::BadRequest,
                    "this model has no usable chat template (the daemon's log says why at start): \
                     send a raw prompt instead of a chat",
                )
            })?;
            let r = template.render_protected(req.system.as_deref(), messages, true)?;
            let ranges = r.ranges();
            let ids = tok.encode_protected(&r.text, true, &ranges);
            // The prefix ends where the first user message's content starts.
            let offset = usize::from(req.system.is_some());
            let first_user = r.contents.iter().find(|(i, _)| {
                i.checked_sub(offset)
                    .and_then(|i| messages.get(i))
                    .is_some_and(|m| m.role == "user")
            });
            let prefix = first_user.map(|(_, at)| {
                let before: Vec<_> = ranges
                    .iter()
                    .filter(|c| c.end <= at.start)
                    .cloned()
                    .collect();
                tok.encode_protected(&r.text[..at.start], true, &before)
            });
            (ids, prefix)
        }
    };
    let mut truncated = 0;
    if ids.len() >= n_ctx {
        if !req.truncate {
            return Err(ServiceError::new(
                ErrorCode::ContextFull,
                format!(
                    "the prompt is {} tokens but the context holds {n_ctx}",
                    ids.len()
                ),
            ));
        }
        // Room for the answer: max_tokens, but at most half the context.
        let room = req.max_tokens.min(n_ctx / 2).max(1);
        let keep = n_ctx.saturating_sub(room);
        truncated = ids.len() - keep;
        tracing::warn!(
            request = req.id,
            dropped = truncated,
            kept = keep,
            "prompt truncated from the front to fit the context"
        );
        ids.drain(..truncated);
    }
    if ids.is_empty() {
        return Err(empty());
    }
    Ok(Built {
        ids,
        truncated,
        system_prefix,
    })
}

fn empty() -> ServiceError {
    ServiceError::new(ErrorCode::BadRequest, "the prompt is empty")
}
