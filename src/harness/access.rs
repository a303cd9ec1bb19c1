//! How a runner opens and closes an execution at the gateway: the
//! per-execution key the harness authenticates with, and the base URL it
//! is pointed at. Closing makes the key stop working, so nothing the
//! harness left behind can still append to its records.
//!
//! Two ways in: the gateway's admin HTTP API (a `gyre gateway` process,
//! possibly on another host), or a [`Gateway`] in this process.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use crate::gateway::service::Gateway;

/// What a harness needs to reach its execution at the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The gateway's execution id (`GYRE_EXECUTION`).
    pub execution: String,
    /// The per-execution API key.
    pub key: String,
    /// `http://host:port` of the API listener (no `/v1`).
    pub api_base: String,
}

/// Why the gateway could not open or close an execution.
#[derive(Debug, Clone, thiserror::Error)]
#[error("gateway: {0}")]
pub struct AccessError(pub String);

/// Opens and closes executions at a gateway.
pub trait GatewayAccess: Send + Sync + 'static {
    /// `query` and `group` are recorded with the execution (the admin
    /// API's `{"query", "group"}`).
    fn open(&self, query: Value, group: String) -> BoxFuture<'_, Result<Credentials, AccessError>>;
    fn close(&self, execution: String) -> BoxFuture<'_, Result<(), AccessError>>;
}

/// The admin HTTP API of a `gyre gateway`.
#[derive(Debug, Clone)]
pub struct AdminHttp {
    client: reqwest::Client,
    admin_base: String,
    api_base: String,
    token: String,
}

impl AdminHttp {
    /// `admin_base` and `api_base` as `http://host:port`.
    pub fn new(admin_base: &str, api_base: &str, token: &str) -> Self {
        Self {
            client: reqwest::Client::new(),
            admin_base: admin_base.trim_end_matches('/').to_string(),
            api_base: api_base.trim_end_matches('/').to_string(),
            token: token.to_string(),
        }
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value, AccessError> {
        let err = |e: reqwest::Error| AccessError(format!("POST {path}: {e}"));
        let resp = self
            .client
            .post(format!("{}{path}", self.admin_base))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .map_err(err)?;
        let status = resp.status();
        let text = resp.text().await.map_err(err)?;
        if !status.is_success() {
            return Err(AccessError(format!("POST {path}: {status}: {text}")));
        }
        serde_json::from_str(&text).map_err(|e| AccessError(format!("POST {path}: {e}: {text}")))
    }
}

impl GatewayAccess for AdminHttp {
    fn open(&self, query: Value, group: String) -> BoxFuture<'_, Result<Credentials, AccessError>> {
        Box::pin(async move {
            let v = self
                .post("/admin/executions", json!({"query": query, "group": group}))
                .await?;
            let field = |k: &str| {
                v.get(k)
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| AccessError(format!("no `{k}` in {v}")))
            };
            Ok(Credentials {
                execution: field("execution")?,
                key: field("key")?,
                api_base: self.api_base.clone(),
            })
        })
    }

    fn close(&self, execution: String) -> BoxFuture<'_, Result<(), AccessError>> {
        Box::pin(async move {
            self.post(&format!("/admin/executions/{execution}/close"), json!({}))
                .await
                .map(|_| ())
        })
    }
}

/// A gateway served by this process.
#[derive(Clone)]
pub struct InProcess {
    pub gateway: Arc<Gateway>,
    pub api_base: String,
}

impl GatewayAccess for InProcess {
    fn open(&self, query: Value, group: String) -> BoxFuture<'_, Result<Credentials, AccessError>> {
        Box::pin(async move {
            let gw = self.gateway.clone();
            let meta =
                tokio::task::spawn_blocking(move || gw.create_execution(Some(query), Some(group)))
                    .await
                    .map_err(|e| AccessError(e.to_string()))?
                    .map_err(|e| AccessError(e.message().to_string()))?;
            Ok(Credentials {
                execution: meta.id,
                key: meta.key,
                api_base: self.api_base.clone(),
            })
        })
    }

    fn close(&self, execution: String) -> BoxFuture<'_, Result<(), AccessError>> {
        Box::pin(async move {
            let gw = self.gateway.clone();
            tokio::task::spawn_blocking(move || gw.close_execution(&execution))
                .await
                .map_err(|e| AccessError(e.to_string()))?
                .map(|_| ())
                .map_err(|e| AccessError(e.message().to_string()))
        })
    }
}
