//! Choosing a provider: `PROVIDER:MODEL` parsing, the providers' environment variables and
//! base URLs, and building a ready [`ModelProvider`] from them.
//!
//! It owns the user-facing naming (`openai`, `anthropic`, `openai-compatible`) and where keys
//! come from; it does not talk to the network.

use std::fmt;
use std::sync::Arc;

use cordon_core::provider::ModelProvider;

use crate::anthropic::{AnthropicConfig, AnthropicProvider};
use crate::error::ModelError;
use crate::openai::{OpenAiConfig, OpenAiProvider};
use crate::retry::RetryPolicy;

/// The wire protocols and their usual homes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// OpenAI chat completions at `https://api.openai.com/v1` (or `OPENAI_BASE_URL`), key
    /// required.
    OpenAi,
    /// Any server speaking OpenAI chat completions (llama.cpp, vLLM, Ollama, …) at a base URL
    /// you give; the key is optional and has its own variable, so an OpenAI key is never sent
    /// to another host by accident.
    OpenAiCompatible,
    /// The Anthropic Messages API.
    Anthropic,
}

impl ProviderKind {
    /// The name used in `PROVIDER:MODEL` and in messages.
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "openai",
            ProviderKind::OpenAiCompatible => "openai-compatible",
            ProviderKind::Anthropic => "anthropic",
        }
    }

    /// The environment variable holding the API key.
    pub fn api_key_env(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "OPENAI_API_KEY",
            ProviderKind::OpenAiCompatible => "OPENAI_COMPATIBLE_API_KEY",
            ProviderKind::Anthropic => "ANTHROPIC_API_KEY",
        }
    }

    /// The environment variable that overrides the base URL (the official SDKs' convention,
    /// and its analogue for `openai-compatible`).
    pub fn base_url_env(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "OPENAI_BASE_URL",
            ProviderKind::OpenAiCompatible => "OPENAI_COMPATIBLE_BASE_URL",
            ProviderKind::Anthropic => "ANTHROPIC_BASE_URL",
        }
    }

    /// The base URL used when none is given; `None` for `openai-compatible`.
    pub fn default_base_url(self) -> Option<&'static str> {
        match self {
            ProviderKind::OpenAi => Some("https://api.openai.com/v1"),
            ProviderKind::OpenAiCompatible => None,
            ProviderKind::Anthropic => Some("https://api.anthropic.com"),
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A parsed `PROVIDER:MODEL`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    /// The provider.
    pub provider: ProviderKind,
    /// The model name as the provider knows it; may itself contain `:` (Ollama tags).
    pub model: String,
}

/// Parse `PROVIDER:MODEL`: `openai:gpt-4.1`, `anthropic:claude-sonnet-4-5`,
/// `openai-compatible:qwen3:8b`. Only the first `:` separates; the provider is
/// case-insensitive.
pub fn parse_model_spec(spec: &str) -> Result<ModelSpec, ModelError> {
    let trimmed = spec.trim();
    let Some((provider, model)) = trimmed.split_once(':') else {
        return Err(ModelError::MissingProvider {
            spec: spec.to_owned(),
            hint: suggest_provider(trimmed),
        });
    };
    let provider = match provider.trim().to_ascii_lowercase().as_str() {
        "openai" => ProviderKind::OpenAi,
        "anthropic" => ProviderKind::Anthropic,
        "openai-compatible" | "openai_compatible" => ProviderKind::OpenAiCompatible,
        _ => {
            return Err(ModelError::UnknownProvider {
                spec: spec.to_owned(),
                provider: provider.to_owned(),
            });
        }
    };
    let model = model.trim();
    if model.is_empty() {
        return Err(ModelError::EmptyModel {
            spec: spec.to_owned(),
            provider,
        });
    }
    Ok(ModelSpec {
        provider,
        model: model.to_owned(),
    })
}

fn suggest_provider(model: &str) -> String {
    let lower = model.to_ascii_lowercase();
    let provider = if lower.starts_with("claude") {
        "anthropic"
    } else if ["gpt-", "o1", "o3", "o4", "chatgpt"]
        .iter()
        .any(|prefix| lower.starts_with(prefix))
    {
        "openai"
    } else {
        return String::new();
    };
    format!("; did you mean {provider}:{model}?")
}

/// What a caller may set besides `PROVIDER:MODEL`; everything else comes from the
/// environment.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ProviderOptions {
    /// Base URL (`--base-url`); wins over the provider's base-URL variable.
    pub base_url: Option<String>,
    /// Output token limit; provider defaults when `None`.
    pub max_tokens: Option<u32>,
    /// Retry behaviour.
    pub retry: RetryPolicy,
}

/// Build the provider for `spec`, reading the API key and base URL from the process
/// environment (see [`provider_with_env`]).
pub fn provider_from_env(
    spec: &ModelSpec,
    options: &ProviderOptions,
) -> Result<Arc<dyn ModelProvider>, ModelError> {
    provider_with_env(spec, options, &|name| std::env::var(name).ok())
}

/// Build the provider for `spec`, reading variables through `env`:
/// - the key from [`ProviderKind::api_key_env`]: `OPENAI_API_KEY`, `ANTHROPIC_API_KEY`,
///   `OPENAI_COMPATIBLE_API_KEY`. Required for `anthropic` and for `openai` at its default URL;
///   optional for `openai-compatible` and for `openai` with a custom base URL, since local
///   servers usually need none. With a custom base URL, `openai` sends `OPENAI_API_KEY` there
///   (the SDKs' convention); `openai-compatible` never reads `OPENAI_API_KEY`;
/// - the base URL from `options.base_url`, else [`ProviderKind::base_url_env`], else the
///   provider's default (`openai-compatible` has none and fails with a hint).
pub fn provider_with_env(
    spec: &ModelSpec,
    options: &ProviderOptions,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn ModelProvider>, ModelError> {
    let ProviderOptions {
        base_url,
        max_tokens,
        retry,
    } = options;
    let kind = spec.provider;
    let non_empty = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let custom_base = base_url
        .clone()
        .filter(|v| !v.trim().is_empty())
        .or_else(|| non_empty(kind.base_url_env()));
    let key = non_empty(kind.api_key_env());
    match kind {
        ProviderKind::OpenAi | ProviderKind::OpenAiCompatible => {
            let base = match (&custom_base, kind.default_base_url()) {
                (Some(url), _) => url.clone(),
                (None, Some(default)) => default.to_owned(),
                (None, None) => {
                    return Err(ModelError::MissingBaseUrl {
                        model: spec.model.clone(),
                    });
                }
            };
            if key.is_none() && kind == ProviderKind::OpenAi && custom_base.is_none() {
                return Err(ModelError::MissingApiKey {
                    provider: kind,
                    env_var: kind.api_key_env(),
                });
            }
            let mut config = OpenAiConfig::new(kind, &spec.model, base);
            config.api_key = key;
            config.max_tokens = *max_tokens;
            config.retry = retry.clone();
            Ok(Arc::new(OpenAiProvider::new(config)?))
        }
        ProviderKind::Anthropic => {
            let Some(key) = key else {
                return Err(ModelError::MissingApiKey {
                    provider: kind,
                    env_var: kind.api_key_env(),
                });
            };
            let base = custom_base.unwrap_or_else(|| {
                kind.default_base_url()
                    .unwrap_or("https://api.anthropic.com")
                    .to_owned()
            });
            let mut config = AnthropicConfig::new(&spec.model, base, key);
            config.max_tokens = *max_tokens;
            config.retry = retry.clone();
            Ok(Arc::new(AnthropicProvider::new(config)?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_providers_and_keeps_colons_in_model_names() {
        assert_eq!(
            parse_model_spec("openai:gpt-4.1").unwrap(),
            ModelSpec {
                provider: ProviderKind::OpenAi,
                model: "gpt-4.1".into()
            }
        );
        assert_eq!(
            parse_model_spec(" Anthropic:claude-sonnet-4-5 ").unwrap(),
            ModelSpec {
                provider: ProviderKind::Anthropic,
                model: "claude-sonnet-4-5".into()
            }
        );
        assert_eq!(
            parse_model_spec("openai-compatible:qwen3:8b").unwrap(),
            ModelSpec {
                provider: ProviderKind::OpenAiCompatible,
                model: "qwen3:8b".into()
            }
        );
    }

    #[test]
    fn explains_bad_specs() {
        let err = parse_model_spec("claude-sonnet-4-5")
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected PROVIDER:MODEL"), "{err}");
        assert!(
            err.contains("did you mean anthropic:claude-sonnet-4-5?"),
            "{err}"
        );
        let err = parse_model_spec("gpt-4.1").unwrap_err().to_string();
        assert!(err.contains("did you mean openai:gpt-4.1?"), "{err}");
        let err = parse_model_spec("llama").unwrap_err().to_string();
        assert!(!err.contains("did you mean"), "{err}");
        let err = parse_model_spec("gemini:pro").unwrap_err().to_string();
        assert_eq!(
            err,
            "failed to parse model \"gemini:pro\": unknown provider \"gemini\"; \
             use openai, anthropic or openai-compatible"
        );
        let err = parse_model_spec("openai:").unwrap_err().to_string();
        assert_eq!(
            err,
            "failed to parse model \"openai:\": the model name after \"openai:\" is empty"
        );
    }

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn keys_are_required_where_the_provider_needs_them() {
        let openai = parse_model_spec("openai:gpt-4.1").unwrap();
        let err = provider_with_env(&openai, &ProviderOptions::default(), &env_of(&[]))
            .err()
            .unwrap()
            .to_string();
        assert_eq!(
            err,
            "failed to configure openai: OPENAI_API_KEY is not set; export your API key in it"
        );
        let err = provider_with_env(
            &openai,
            &ProviderOptions::default(),
            &env_of(&[("OPENAI_API_KEY", "  ")]),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("OPENAI_API_KEY is not set"), "{err}");
        assert!(
            provider_with_env(
                &openai,
                &ProviderOptions::default(),
                &env_of(&[("OPENAI_API_KEY", "sk-test")])
            )
            .is_ok()
        );

        let anthropic = parse_model_spec("anthropic:claude-sonnet-4-5").unwrap();
        let err = provider_with_env(&anthropic, &ProviderOptions::default(), &env_of(&[]))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("ANTHROPIC_API_KEY is not set"), "{err}");
    }

    #[test]
    fn local_servers_need_a_base_url_but_no_key() {
        let local = parse_model_spec("openai-compatible:qwen3").unwrap();
        let err = provider_with_env(&local, &ProviderOptions::default(), &env_of(&[]))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("no base URL; pass --base-url"), "{err}");
        let options = ProviderOptions {
            base_url: Some("http://127.0.0.1:8080/v1".into()),
            ..ProviderOptions::default()
        };
        assert!(provider_with_env(&local, &options, &env_of(&[])).is_ok());
        assert!(
            provider_with_env(
                &local,
                &ProviderOptions::default(),
                &env_of(&[("OPENAI_COMPATIBLE_BASE_URL", "http://127.0.0.1:11434/v1")])
            )
            .is_ok()
        );
        // OPENAI_BASE_URL belongs to `openai`, not to `openai-compatible`.
        assert!(
            provider_with_env(
                &local,
                &ProviderOptions::default(),
                &env_of(&[("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1")])
            )
            .is_err()
        );
        // `openai` pointed elsewhere behaves like a local server: no key needed.
        let openai = parse_model_spec("openai:gpt-oss").unwrap();
        assert!(provider_with_env(&openai, &options, &env_of(&[])).is_ok());
    }

    #[test]
    fn rejects_base_urls_that_are_not_http() {
        let local = parse_model_spec("openai-compatible:qwen3").unwrap();
        for bad in ["localhost:8080", "ftp://host/v1", "not a url"] {
            let options = ProviderOptions {
                base_url: Some(bad.into()),
                ..ProviderOptions::default()
            };
            let err = provider_with_env(&local, &options, &env_of(&[]))
                .err()
                .unwrap()
                .to_string();
            assert!(err.starts_with("failed to parse base URL"), "{bad}: {err}");
        }
    }
}
