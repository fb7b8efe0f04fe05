//! USD per million tokens, per model.

use rust_decimal::Decimal;

use super::Usage;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    pub input_per_m: Decimal,
    pub output_per_m: Decimal,
    pub cached_per_m: Decimal,
}

impl Price {
    /// Cost of one call. Cached prompt tokens are part of `input_tokens` and billed at the
    /// cached rate instead of the input rate.
    pub fn cost(&self, u: &Usage) -> Decimal {
        let m = Decimal::from(1_000_000u32);
        let uncached = u.input_tokens.saturating_sub(u.cached_tokens);
        (Decimal::from(uncached) * self.input_per_m
            + Decimal::from(u.cached_tokens) * self.cached_per_m
            + Decimal::from(u.output_tokens) * self.output_per_m)
            / m
    }
}

fn p(i: &str, o: &str, c: &str) -> Price {
    Price {
        input_per_m: i.parse().unwrap_or_default(),
        output_per_m: o.parse().unwrap_or_default(),
        cached_per_m: c.parse().unwrap_or_default(),
    }
}

/// The price of `provider/model`, if known.
pub fn price_of(provider: &str, _model: &str) -> Option<Price> {
    match provider {
        "mock" => Some(p("1", "2", "0.1")),
        _ => None,
    }
}
