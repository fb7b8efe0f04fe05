//! USD per million tokens, per model: configured prices first; the shipped list prices of common
//! OpenAI and Anthropic models for the providers that bill them (the official APIs, or one
//! configured with `shipped_prices = true`); the mock's own. Any other model has no price: its
//! calls cost `NULL` and the task says its cost is incomplete — a price is never invented.

use std::collections::HashMap;

use rust_decimal::Decimal;

use super::{ModelRef, Usage};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    pub input_per_m: Decimal,
    pub output_per_m: Decimal,
    pub cached_per_m: Decimal,
    /// Prompt tokens written to the provider's cache.
    pub cache_write_per_m: Decimal,
    /// One search of the provider's server-side web search.
    pub web_search: Decimal,
}

impl Price {
    /// Cost of one call. Prompt tokens read from or written to the provider's cache are part
    /// of `input_tokens` and billed at the cached or the cache-write rate instead of the input
    /// rate.
    pub fn cost(&self, u: &Usage) -> Decimal {
        let m = Decimal::from(1_000_000u32);
        let plain = u.input_tokens.saturating_sub(u.cached_tokens).saturating_sub(u.cache_write_tokens);
        (Decimal::from(plain) * self.input_per_m
            + Decimal::from(u.cached_tokens) * self.cached_per_m
            + Decimal::from(u.cache_write_tokens) * self.cache_write_per_m
            + Decimal::from(u.output_tokens) * self.output_per_m)
            / m
            + Decimal::from(u.web_searches) * self.web_search
    }

    /// The most a call of `u`'s size can cost, for reservations: every prompt token at the
    /// dearer of the input and the cache-write rate (a prompt may be written to the cache whole).
    pub fn worst_cost(&self, u: &Usage) -> Decimal {
        let rate = self.input_per_m.max(self.cache_write_per_m);
        (Decimal::from(u.input_tokens) * rate + Decimal::from(u.output_tokens) * self.output_per_m)
            / Decimal::from(1_000_000u32)
    }
}

fn p(i: &str, o: &str, c: &str, w: &str) -> Price {
    Price {
        input_per_m: i.parse().unwrap_or_default(),
        output_per_m: o.parse().unwrap_or_default(),
        cached_per_m: c.parse().unwrap_or_default(),
        cache_write_per_m: w.parse().unwrap_or_default(),
        web_search: Decimal::ZERO,
    }
}

/// Anthropic's list price of one server-side web search ($10 per 1,000).
fn anthropic_search() -> Decimal {
    Decimal::new(1, 2)
}

/// Shipped defaults (list prices, USD per million tokens: input, output, cache read, cache
/// write), matched by model name or its dated variants (`gpt-4o-2024-08-06` → `gpt-4o`).
/// OpenAI's automatic caching writes at the input price; Anthropic bills a five-minute cache
/// write at 1.25 times it (the TTL this service asks for).
const DEFAULTS: &[(&str, &str, &str, &str, &str)] = &[
    ("gpt-5", "1.25", "10", "0.125", "1.25"),
    ("gpt-5-mini", "0.25", "2", "0.025", "0.25"),
    ("gpt-5-nano", "0.05", "0.4", "0.005", "0.05"),
    ("gpt-4.1", "2", "8", "0.5", "2"),
    ("gpt-4.1-mini", "0.4", "1.6", "0.1", "0.4"),
    ("gpt-4.1-nano", "0.1", "0.4", "0.025", "0.1"),
    ("gpt-4o", "2.5", "10", "1.25", "2.5"),
    ("gpt-4o-mini", "0.15", "0.6", "0.075", "0.15"),
    ("o3", "2", "8", "0.5", "2"),
    ("o4-mini", "1.1", "4.4", "0.275", "1.1"),
    ("claude-opus-4-1", "15", "75", "1.5", "18.75"),
    ("claude-opus-4", "15", "75", "1.5", "18.75"),
    ("claude-sonnet-4-5", "3", "15", "0.3", "3.75"),
    ("claude-sonnet-4", "3", "15", "0.3", "3.75"),
    ("claude-3-7-sonnet", "3", "15", "0.3", "3.75"),
    ("claude-haiku-4-5", "1", "5", "0.1", "1.25"),
    ("claude-3-5-haiku", "0.8", "4", "0.08", "1"),
];

#[derive(Debug, Clone, Default)]
pub struct PriceTable {
    /// Keyed by `provider/model` or by bare model name.
    pub overrides: HashMap<String, Price>,
}

impl PriceTable {
    /// The price of `m`; `shipped`: its provider bills the shipped list prices.
    pub fn price(&self, m: &ModelRef, shipped: bool) -> Option<Price> {
        if let Some(p) = self.overrides.get(&m.full()).or_else(|| self.overrides.get(&m.model)) {
            return Some(*p);
        }
        if m.provider == "mock" {
            // (It has no cache: writes are billed as input.)
            return Some(p("1", "2", "0.1", "1"));
        }
        if !shipped {
            return None;
        }
        // Longest name that the model equals or extends with `-<suffix>`.
        DEFAULTS
            .iter()
            .filter(|(name, ..)| {
                m.model == *name || m.model.strip_prefix(name).is_some_and(|rest| rest.starts_with('-'))
            })
            .max_by_key(|(name, ..)| name.len())
            .map(|(name, i, o, c, w)| Price {
                web_search: if name.starts_with("claude") { anthropic_search() } else { Decimal::ZERO },
                ..p(i, o, c, w)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> ModelRef {
        ModelRef::parse(s).unwrap()
    }

    #[test]
    fn dated_variants_match_their_family_and_the_longest_name_wins() {
        let t = PriceTable::default();
        assert_eq!(t.price(&m("openai/gpt-4o-2024-08-06"), true), Some(p("2.5", "10", "1.25", "2.5")));
        assert_eq!(t.price(&m("openai/gpt-4o-mini"), true), Some(p("0.15", "0.6", "0.075", "0.15")));
        assert_eq!(
            t.price(&m("anthropic/claude-sonnet-4-5-20250929"), true),
            Some(Price { web_search: Decimal::new(1, 2), ..p("3", "15", "0.3", "3.75") })
        );
        assert_eq!(t.price(&m("openai/gpt-4oz"), true), None);
        assert_eq!(t.price(&m("local/llama3"), true), None);
        assert_eq!(t.price(&m("smol/gpt-4o"), false), None, "a local server's gpt-4o is not OpenAI's");
        assert!(t.price(&m("mock/x"), false).is_some());
    }

    #[test]
    fn overrides_win_and_cached_tokens_bill_at_the_cached_rate() {
        let mut t = PriceTable::default();
        t.overrides.insert("local/llama3".into(), p("0", "0", "0", "0"));
        t.overrides.insert("gpt-4o".into(), p("1", "1", "1", "1"));
        assert_eq!(t.price(&m("local/llama3"), false), Some(p("0", "0", "0", "0")));
        assert_eq!(t.price(&m("openai/gpt-4o"), true), Some(p("1", "1", "1", "1")));
        let price = p("2", "10", "1", "2.5");
        let u = Usage { input_tokens: 1_000_000, output_tokens: 100_000, cached_tokens: 500_000, ..Usage::default() };
        // 500k uncached at $2 + 500k cached at $1 + 100k output at $10.
        assert_eq!(price.cost(&u), Decimal::new(25, 1));
    }

    #[test]
    fn cache_writes_bill_at_the_write_rate_and_reads_at_the_cached_rate() {
        let t = PriceTable::default();
        let sonnet = t.price(&m("anthropic/claude-sonnet-4-5"), true).unwrap();
        // 1,000 plain + 4,000 written + 5,000 read; 200 out.
        let u = Usage {
            input_tokens: 10_000,
            output_tokens: 200,
            cached_tokens: 5_000,
            cache_write_tokens: 4_000,
            ..Usage::default()
        };
        // (1000 × 3 + 4000 × 3.75 + 5000 × 0.3 + 200 × 15) / 1e6 = 0.0225
        assert_eq!(sonnet.cost(&u), Decimal::new(225, 4));
        // Two server-side searches at $0.01 each.
        assert_eq!(sonnet.cost(&Usage { web_searches: 2, ..u }), Decimal::new(425, 4));
    }
}
