//! `cordon-model`: Cordon's model provider clients: OpenAI-compatible chat completions and Anthropic Messages.
#![warn(missing_docs)]
