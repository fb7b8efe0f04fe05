//! The service's web pages — the ops console and the API reference (`/docs`, Redoc rendering
//! openapi.yaml): static assets embedded in the binary (no build step, works offline), served
//! with a content hash for long caching, and the pages themselves with a strict
//! Content-Security-Policy (no inline script). The pages read only what the public API serves.
//!
//! May import: nothing of this crate (`http::console` serves it).

use std::sync::LazyLock;

use sha2::{Digest, Sha256};

/// One embedded file.
pub struct Asset {
    pub path: &'static str,
    pub content_type: &'static str,
    pub bytes: &'static [u8],
    /// The first 16 hex digits of its SHA-256: its version in URLs and its ETag.
    pub hash: String,
}

macro_rules! asset {
    ($path:literal, $ct:literal) => {
        ($path, $ct, include_bytes!(concat!("assets/", $path)).as_slice())
    };
}

const FILES: &[(&str, &str, &[u8])] = &[
    asset!("app.js", "text/javascript; charset=utf-8"),
    asset!("app.css", "text/css; charset=utf-8"),
    asset!("vendor/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    asset!("vendor/uPlot.min.css", "text/css; charset=utf-8"),
    asset!("vendor/uPlot.LICENSE", "text/plain; charset=utf-8"),
    asset!("docs.js", "text/javascript; charset=utf-8"),
    // Redoc 2.5.4 (npm `redoc`, bundles/redoc.standalone.js), MIT; its licence and those of what
    // it bundles are in vendor/redoc.LICENSE.
    asset!("vendor/redoc.standalone.js", "text/javascript; charset=utf-8"),
    asset!("vendor/redoc.LICENSE", "text/plain; charset=utf-8"),
];

static ASSETS: LazyLock<Vec<Asset>> = LazyLock::new(|| {
    FILES
        .iter()
        .map(|(path, content_type, bytes)| Asset {
            path,
            content_type,
            bytes,
            hash: hex::encode(&Sha256::digest(bytes)[..8]),
        })
        .collect()
});

/// The embedded file at `path` (relative to the assets folder).
pub fn asset(path: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.path == path)
}

/// The URL of an asset, with its version.
fn url(path: &str) -> String {
    let v = asset(path).map(|a| a.hash.as_str()).unwrap_or("0");
    format!("/console/assets/{path}?v={v}")
}

/// The page, its asset URLs versioned by content.
pub static INDEX: LazyLock<String> = LazyLock::new(|| {
    include_str!("assets/index.html")
        .replace("{{css_uplot}}", &url("vendor/uPlot.min.css"))
        .replace("{{css_app}}", &url("app.css"))
        .replace("{{js_uplot}}", &url("vendor/uPlot.iife.min.js"))
        .replace("{{js_app}}", &url("app.js"))
});

/// The API reference's page, its asset URLs versioned by content.
pub static DOCS: LazyLock<String> = LazyLock::new(|| {
    include_str!("assets/docs.html")
        .replace("{{js_redoc}}", &url("vendor/redoc.standalone.js"))
        .replace("{{js_docs}}", &url("docs.js"))
});

/// The document the reference renders (and `GET /openapi.yaml` serves).
pub const OPENAPI: &str = include_str!("../../openapi.yaml");

/// The API reference's headers: the console's, but styles may be set by script (Redoc draws
/// with styled-components, which writes its rules into `<style>` elements), and fonts and
/// images may be data: URLs. Scripts, connections and everything else: this origin only.
pub const DOCS_SECURITY_HEADERS: &[(&str, &str)] = &[
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
         font-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
];

/// The headers every console response carries: a strict CSP (no inline script or style, no
/// framing), no sniffing, no referrer.
pub const SECURITY_HEADERS: &[(&str, &str)] = &[
    (
        "content-security-policy",
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
         frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_every_asset_by_its_version_and_has_no_inline_script() {
        let page = INDEX.as_str();
        for path in ["app.js", "app.css", "vendor/uPlot.iife.min.js", "vendor/uPlot.min.css"] {
            let a = asset(path).unwrap();
            assert!(page.contains(&format!("/console/assets/{path}?v={}", a.hash)), "{path}");
        }
        assert!(!page.contains("{{"), "a placeholder was left");
        let lower = page.to_ascii_lowercase();
        for inline in ["<script>", "onload=", "onclick=", "onerror=", "style=", "<style"] {
            assert!(!lower.contains(inline), "inline {inline} in the page");
        }
    }

    #[test]
    fn the_reference_page_names_its_assets_by_version_and_has_no_inline_script() {
        let page = DOCS.as_str();
        for path in ["vendor/redoc.standalone.js", "docs.js"] {
            let a = asset(path).unwrap();
            assert!(page.contains(&format!("/console/assets/{path}?v={}", a.hash)), "{path}");
        }
        assert!(!page.contains("{{"), "a placeholder was left");
        assert!(!page.to_ascii_lowercase().contains("<script>"), "inline script in the page");
        assert!(OPENAPI.starts_with("openapi: 3."), "the embedded document is openapi.yaml");
    }
}
