//! `GET /overview`: what the console's landing page shows, for the caller's tenant (or every
//! tenant, for the admin).

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::auth::Scope;
use super::error::ApiError;
use super::AppState;

pub fn router() -> Router<AppState> {
    Router::new().route("/overview", get(read))
}

async fn read(State(st): State<AppState>, scope: Scope) -> Result<Json<Value>, ApiError> {
    let mut overview = st.res.overview(scope.tenant()).await?;
    overview["this_replica"]["connections"] = json!(st.conns.open());
    overview["this_replica"]["connection_cap"] = json!(st.conns.cap);
    Ok(Json(overview))
}
