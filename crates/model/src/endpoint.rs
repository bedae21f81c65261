//! Where a provider's requests go, set up once: the endpoint URL, the HTTP client, the fixed
//! headers (JSON in, event stream out, the key, protocol headers), and sending one turn's body
//! there through the transport.
//!
//! Owns what both providers set up the same way, so each provider module keeps only what
//! differs: its path, how it carries its key, its request body and its stream decoder.
//! It does not own retrying, status errors or cancellation (the transport does) nor any JSON
//! shape of a provider.

use cordon_core::protocol::AssistantMessage;
use cordon_core::provider::StreamCallback;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::error::ModelError;
use crate::retry::RetryPolicy;
use crate::spec::ProviderKind;
use crate::transport::{self, CONNECT_TIMEOUT, Decoder, Exchange, READ_IDLE_TIMEOUT};

/// What a provider needs to reach its API.
pub(crate) struct EndpointSpec<'a> {
    /// Which provider, for messages.
    pub(crate) provider: ProviderKind,
    /// The configured base URL.
    pub(crate) base_url: &'a str,
    /// The path appended to it (`chat/completions`, `v1/messages`).
    pub(crate) path: &'static str,
    /// The header that carries the key and its whole value (`Bearer …` or the bare key);
    /// `None` sends no key.
    pub(crate) key: Option<(HeaderName, String)>,
    /// Protocol headers of the provider (API version).
    pub(crate) fixed: &'static [(&'static str, &'static str)],
}

/// A provider's endpoint: validated URL, client and headers, ready for any number of turns.
pub(crate) struct Endpoint {
    provider: ProviderKind,
    client: reqwest::Client,
    url: reqwest::Url,
    headers: HeaderMap,
}

/// One turn to send.
pub(crate) struct Turn<'a> {
    /// The model requested, for messages and the message's `model` field.
    pub(crate) model: &'a str,
    /// The provider's JSON request body.
    pub(crate) body: Value,
    /// Retry behaviour.
    pub(crate) retry: &'a RetryPolicy,
    /// Cancellation of the whole call.
    pub(crate) cancel: &'a CancellationToken,
    /// Streamed progress.
    pub(crate) on_event: StreamCallback<'a>,
}

impl Endpoint {
    /// Check the URL, build the headers (the key marked sensitive, so it stays out of logs and
    /// `Debug` output) and the client.
    pub(crate) fn new(spec: EndpointSpec<'_>) -> Result<Self, ModelError> {
        let EndpointSpec {
            provider,
            base_url,
            path,
            key,
            fixed,
        } = spec;
        let url = endpoint_url(base_url, path)?;
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        for (name, value) in fixed {
            headers.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        if let Some((name, value)) = key {
            let mut value =
                HeaderValue::from_str(&value).map_err(|_| ModelError::InvalidApiKey {
                    provider,
                    env_var: provider.api_key_env(),
                })?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let client = build_client(provider, &url)?;
        Ok(Endpoint {
            provider,
            client,
            url,
            headers,
        })
    }

    /// The endpoint requests go to.
    pub(crate) fn url(&self) -> &reqwest::Url {
        &self.url
    }

    /// Encode `turn`'s body, send it and decode the answer with a fresh decoder per attempt.
    pub(crate) async fn stream<D: Decoder>(
        &self,
        turn: Turn<'_>,
        new_decoder: impl Fn() -> D,
    ) -> Result<AssistantMessage, ModelError> {
        let Turn {
            model,
            body,
            retry,
            cancel,
            on_event,
        } = turn;
        let provider = self.provider;
        let body = serde_json::to_vec(&body)
            .map_err(|source| ModelError::EncodeRequest { provider, source })?;
        let exchange = Exchange {
            client: &self.client,
            provider,
            model,
            url: &self.url,
            headers: &self.headers,
            body,
            retry,
            cancel,
            on_event,
        };
        transport::stream_message(exchange, new_decoder).await
    }
}

/// `base` + `/` + `path`, after checking `base` is an absolute http(s) URL.
fn endpoint_url(base: &str, path: &str) -> Result<reqwest::Url, ModelError> {
    let invalid = |reason: String| ModelError::InvalidBaseUrl {
        url: base.to_owned(),
        reason,
    };
    let parsed = reqwest::Url::parse(base.trim()).map_err(|e| invalid(e.to_string()))?;
    match parsed.scheme() {
        "http" | "https" => {}
        other => {
            return Err(invalid(format!(
                "scheme {other:?} is not http or https (write it like http://127.0.0.1:8080/v1)"
            )));
        }
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(invalid("a base URL takes no query or fragment".to_owned()));
    }
    let joined = format!("{}/{path}", parsed.as_str().trim_end_matches('/'));
    reqwest::Url::parse(&joined).map_err(|e| invalid(e.to_string()))
}

/// The HTTP client both providers use: rustls, bounded connect time, generous idle time.
/// Proxies from the environment (`HTTPS_PROXY`, `NO_PROXY`, …) apply, except to a loopback
/// server: a local model server is never reached through a proxy.
fn build_client(kind: ProviderKind, url: &reqwest::Url) -> Result<reqwest::Client, ModelError> {
    let mut builder = reqwest::Client::builder()
        .user_agent(concat!("cordon/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(READ_IDLE_TIMEOUT);
    if is_loopback(url) {
        builder = builder.no_proxy();
    }
    builder.build().map_err(|source| ModelError::BuildClient {
        provider: kind,
        source,
    })
}

fn is_loopback(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => {
            let host = host.to_ascii_lowercase();
            host == "localhost" || host.ends_with(".localhost")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::AUTHORIZATION;

    #[test]
    fn loopback_hosts_are_recognised() {
        for (url, expected) in [
            ("http://127.0.0.1:8080/v1", true),
            ("http://127.8.0.1/v1", true),
            ("http://[::1]:8000/v1", true),
            ("http://LocalHost:11434/v1", true),
            ("https://api.openai.com/v1", false),
            ("http://10.0.0.5:8000/v1", false),
            ("http://localhost.example.com/v1", false),
        ] {
            assert_eq!(
                is_loopback(&reqwest::Url::parse(url).unwrap()),
                expected,
                "{url}"
            );
        }
    }

    #[test]
    fn endpoint_urls_join_and_validate() {
        assert_eq!(
            endpoint_url("http://127.0.0.1:8080/v1/", "chat/completions")
                .unwrap()
                .as_str(),
            "http://127.0.0.1:8080/v1/chat/completions"
        );
        assert_eq!(
            endpoint_url("https://api.anthropic.com", "v1/messages")
                .unwrap()
                .as_str(),
            "https://api.anthropic.com/v1/messages"
        );
        assert!(endpoint_url("http://h/v1?x=1", "chat/completions").is_err());
        assert!(endpoint_url("file:///tmp", "chat/completions").is_err());
    }

    fn spec(key: Option<(HeaderName, String)>) -> EndpointSpec<'static> {
        EndpointSpec {
            provider: ProviderKind::OpenAi,
            base_url: "http://127.0.0.1:8080/v1",
            path: "chat/completions",
            key,
            fixed: &[("x-protocol", "7")],
        }
    }

    #[test]
    fn headers_carry_the_protocol_and_a_sensitive_key() {
        let endpoint = Endpoint::new(spec(Some((AUTHORIZATION, "Bearer sk-1".to_owned()))))
            .expect("valid endpoint");
        let header = |name: &str| endpoint.headers.get(name).map(|v| v.to_str().unwrap());
        assert_eq!(header("content-type"), Some("application/json"));
        assert_eq!(header("accept"), Some("text/event-stream"));
        assert_eq!(header("x-protocol"), Some("7"));
        assert_eq!(header("authorization"), Some("Bearer sk-1"));
        assert!(endpoint.headers[AUTHORIZATION].is_sensitive());
        assert!(!format!("{:?}", endpoint.headers).contains("sk-1"));
        assert_eq!(
            endpoint.url().as_str(),
            "http://127.0.0.1:8080/v1/chat/completions"
        );

        let keyless = Endpoint::new(spec(None)).expect("valid endpoint");
        assert!(keyless.headers.get(AUTHORIZATION).is_none());
    }

    #[test]
    fn a_key_that_cannot_be_a_header_names_its_variable() {
        let Err(error) = Endpoint::new(spec(Some((AUTHORIZATION, "Bearer sk\n1".to_owned()))))
        else {
            panic!("a key with a newline was accepted");
        };
        assert!(
            matches!(
                error,
                ModelError::InvalidApiKey {
                    provider: ProviderKind::OpenAi,
                    env_var: "OPENAI_API_KEY"
                }
            ),
            "{error:?}"
        );
    }
}
