//! Tool-argument validation (docs/semantics.md#pipeline): lenient, schema-driven coercion of
//! primitives followed by JSON Schema validation, with an error the model can act on.
//!
//! This module owns the compiled-validator cache and the exact error text. It does not run
//! `prepare_arguments` (the caller does, before calling in) and it never sees hook mutations:
//! arguments changed by `before_tool_call` are deliberately not revalidated.
//!
//! Coercion follows the schema (`type`, `properties`, `additionalProperties`, `items`,
//! `prefixItems`, local `$ref`s, and the `type`s of `anyOf`/`oneOf` branches) and only ever
//! turns a value the schema rejects into one it accepts:
//! - `"5"` → `5` where a number or integer is expected, `"true"`/`"false"` → booleans;
//! - numbers and booleans → strings where a string is expected;
//! - `null` for an optional property that does not allow `null` is removed (models send
//!   `"offset": null` to mean "absent"); a `null` root becomes `{}` for an object schema.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use jsonschema::error::ValidationErrorKind;
use jsonschema::paths::LocationSegment;
use jsonschema::{ValidationError, Validator};
use serde_json::{Map, Number, Value};

use crate::excerpt::{excerpt, excerpt_value};

/// Longest violation message kept in the error text; longer ones (a huge offending string
/// echoed back) are cut, the full arguments are printed below them anyway.
const MAX_MESSAGE_CHARS: usize = 300;

/// Violations listed in the error text; the rest are counted.
const MAX_VIOLATIONS: usize = 20;

/// How deep `$ref` chains and nested schemas are followed during coercion.
const MAX_SCHEMA_DEPTH: usize = 64;

static GLOBAL_CACHE: LazyLock<ValidatorCache> = LazyLock::new(ValidatorCache::default);

/// Coerce and validate `args` for tool `tool_name` against its JSON Schema `schema`.
///
/// Returns the coerced arguments, or the model-facing error text listing every violation
/// with its dot path and the received `args`. Validators are compiled once per distinct
/// (tool, schema) pair and cached for the life of the process.
pub fn validate_tool_arguments(
    tool_name: &str,
    schema: &Value,
    args: &Value,
) -> Result<Value, String> {
    GLOBAL_CACHE.validate(tool_name, schema, args)
}

/// Build what every first schema compilation needs (the JSON Schema meta-schema's own
/// validator) ahead of time: a CLI that runs one call does this on another thread while it
/// opens its session. Safe to call at any time, any number of times.
pub fn warm_up() {
    // Only the warm-up matters: this schema always compiles.
    let _ = jsonschema::validator_for(&serde_json::json!({"type": "object"}));
}

/// A cache of compiled validators, keyed by tool name and checked against the schema so a
/// tool whose schema changes is recompiled rather than validated against a stale schema.
#[derive(Default)]
pub struct ValidatorCache {
    entries: Mutex<HashMap<String, Vec<CacheEntry>>>,
    compilations: std::sync::atomic::AtomicUsize,
}

struct CacheEntry {
    schema: Value,
    compiled: Result<Arc<Validator>, String>,
}

impl ValidatorCache {
    /// [`validate_tool_arguments`] against this cache instead of the process-wide one.
    pub fn validate(&self, tool_name: &str, schema: &Value, args: &Value) -> Result<Value, String> {
        let validator = self.validator(tool_name, schema).map_err(|reason| {
            format!(
                "Validation failed for tool \"{tool_name}\":\n  - root: the tool's parameter \
                 schema is invalid ({reason}); this is a configuration error, not a problem \
                 with your arguments\n\nReceived arguments:\n{}",
                pretty(args)
            )
        })?;
        let mut coerced = args.clone();
        coerce_root(&mut coerced, schema);
        let (violations, more) = {
            let mut errors = validator.iter_errors(&coerced);
            let shown: Vec<String> = errors.by_ref().take(MAX_VIOLATIONS).map(describe).collect();
            (shown, errors.count())
        };
        if violations.is_empty() {
            return Ok(coerced);
        }
        let mut text = format!("Validation failed for tool \"{tool_name}\":\n");
        for violation in &violations {
            // Writing to a String cannot fail.
            let _ = writeln!(text, "  - {violation}");
        }
        if more > 0 {
            let _ = writeln!(text, "  - … and {more} more violations");
        }
        let _ = write!(text, "\nReceived arguments:\n{}", pretty(args));
        Err(text)
    }

    /// How many schemas this cache has compiled so far.
    pub fn compilations(&self) -> usize {
        self.compilations.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn validator(&self, tool_name: &str, schema: &Value) -> Result<Arc<Validator>, String> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = entries.entry(tool_name.to_owned()).or_default();
        if let Some(entry) = slot.iter().find(|entry| entry.schema == *schema) {
            return entry.compiled.clone();
        }
        self.compilations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let compiled = jsonschema::validator_for(schema)
            .map(Arc::new)
            .map_err(|error| error.to_string());
        slot.push(CacheEntry {
            schema: schema.clone(),
            compiled: compiled.clone(),
        });
        compiled
    }
}

/// The received arguments as the error quotes them: long strings and collections cut (see
/// [`excerpt_value`]), so a huge argument does not come back as a huge error.
fn pretty(value: &Value) -> String {
    let shown = excerpt_value(value);
    serde_json::to_string_pretty(&shown).unwrap_or_else(|_| shown.to_string())
}

/// `path: message` for one violation; `required` names the missing property in the path.
fn describe(error: ValidationError<'_>) -> String {
    let mut segments: Vec<String> = error
        .instance_path()
        .segments()
        .map(|segment| match segment {
            LocationSegment::Property(name) => name.into_owned(),
            LocationSegment::Index(index) => index.to_string(),
        })
        .collect();
    if let ValidationErrorKind::Required { property } = error.kind() {
        segments.push(match property {
            Value::String(name) => name.clone(),
            other => other.to_string(),
        });
    }
    let path = if segments.is_empty() {
        "root".to_owned()
    } else {
        excerpt(&segments.join(".")).into_owned()
    };
    let mut message = error.to_string();
    if let Some((cut, _)) = message.char_indices().nth(MAX_MESSAGE_CHARS) {
        message.truncate(cut);
        message.push('…');
    }
    format!("{path}: {message}")
}

/// The JSON types a schema admits, from `type` or else the `type`s of its union branches.
/// Empty means "unconstrained": no coercion.
fn admitted_types<'s>(schema: &'s Value, root: &'s Value) -> Vec<&'s str> {
    let schema = resolve(schema, root);
    match schema.get("type") {
        Some(Value::String(kind)) => vec![kind.as_str()],
        Some(Value::Array(kinds)) => kinds.iter().filter_map(Value::as_str).collect(),
        Some(_) => Vec::new(),
        None => ["anyOf", "oneOf"]
            .iter()
            .filter_map(|keyword| schema.get(*keyword).and_then(Value::as_array))
            .flatten()
            .flat_map(|branch| admitted_types(branch, root))
            .collect(),
    }
}

/// Follow local `$ref`s (`#/$defs/…`, `#/definitions/…`) to the schema they name.
fn resolve<'s>(mut schema: &'s Value, root: &'s Value) -> &'s Value {
    for _ in 0..MAX_SCHEMA_DEPTH {
        let Some(target) = schema
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|reference| reference.strip_prefix('#'))
            .and_then(|pointer| root.pointer(pointer))
        else {
            return schema;
        };
        schema = target;
    }
    schema
}

fn admits(types: &[&str], value: &Value) -> bool {
    types.iter().any(|kind| match (*kind, value) {
        ("null", Value::Null)
        | ("boolean", Value::Bool(_))
        | ("number", Value::Number(_))
        | ("string", Value::String(_))
        | ("array", Value::Array(_))
        | ("object", Value::Object(_)) => true,
        ("integer", Value::Number(number)) => is_integral(number),
        _ => false,
    })
}

fn is_integral(number: &Number) -> bool {
    number.is_i64() || number.is_u64() || number.as_f64().is_some_and(|f| f.fract() == 0.0)
}

fn coerce_root(args: &mut Value, schema: &Value) {
    let types = admitted_types(schema, schema);
    if args.is_null() && types.contains(&"object") && !types.contains(&"null") {
        *args = Value::Object(Map::new());
    }
    coerce(args, schema, schema, 0);
}

fn coerce(value: &mut Value, schema: &Value, root: &Value, depth: usize) {
    if depth > MAX_SCHEMA_DEPTH {
        return;
    }
    let schema = resolve(schema, root);
    let types = admitted_types(schema, root);
    if !types.is_empty()
        && !admits(&types, value)
        && let Some(converted) = convert_primitive(value, &types)
    {
        *value = converted;
    }
    match value {
        Value::Object(object) => coerce_object(object, schema, root, depth),
        Value::Array(items) => coerce_array(items, schema, root, depth),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {}
    }
}

fn coerce_object(object: &mut Map<String, Value>, schema: &Value, root: &Value, depth: usize) {
    let properties = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|s| s.is_object());
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    object.retain(|name, value| {
        let Some(property_schema) = properties.and_then(|p| p.get(name)).or(additional) else {
            return true;
        };
        let optional_null = value.is_null()
            && !required.contains(&name.as_str())
            && !admitted_types(property_schema, root).contains(&"null");
        if optional_null {
            return false;
        }
        coerce(value, property_schema, root, depth + 1);
        true
    });
}

fn coerce_array(items: &mut [Value], schema: &Value, root: &Value, depth: usize) {
    // 2020-12 tuples use `prefixItems` + `items`; drafts 4–2019 use an `items` array +
    // `additionalItems`.
    let (prefix, rest) = match (schema.get("prefixItems"), schema.get("items")) {
        (Some(Value::Array(prefix)), rest) => (prefix.as_slice(), rest),
        (_, Some(Value::Array(prefix))) => (prefix.as_slice(), schema.get("additionalItems")),
        (_, rest) => (&[][..], rest),
    };
    let rest = rest.filter(|s| s.is_object());
    for (index, item) in items.iter_mut().enumerate() {
        if let Some(item_schema) = prefix.get(index).or(rest) {
            coerce(item, item_schema, root, depth + 1);
        }
    }
}

/// A primitive the schema admits in place of `value`, if there is an obvious one.
fn convert_primitive(value: &Value, types: &[&str]) -> Option<Value> {
    match value {
        Value::String(text) => {
            let text = text.trim();
            let integer = || {
                types
                    .contains(&"integer")
                    .then(|| parse_integer(text))
                    .flatten()
            };
            let number = || {
                types
                    .contains(&"number")
                    .then(|| parse_number(text))
                    .flatten()
            };
            let boolean = || {
                types
                    .contains(&"boolean")
                    .then(|| parse_boolean(text))
                    .flatten()
            };
            integer().or_else(number).or_else(boolean)
        }
        Value::Number(number) if types.contains(&"string") => {
            Some(Value::String(number.to_string()))
        }
        Value::Bool(flag) if types.contains(&"string") => Some(Value::String(flag.to_string())),
        Value::Null | Value::Number(_) | Value::Bool(_) | Value::Array(_) | Value::Object(_) => {
            None
        }
    }
}

fn parse_boolean(text: &str) -> Option<Value> {
    if text.eq_ignore_ascii_case("true") {
        Some(Value::Bool(true))
    } else if text.eq_ignore_ascii_case("false") {
        Some(Value::Bool(false))
    } else {
        None
    }
}

fn parse_integer(text: &str) -> Option<Value> {
    let number = parse_json_number(text)?;
    if number.is_i64() || number.is_u64() {
        return Some(Value::Number(number));
    }
    // "5.0" and "1e3" are integers in JSON Schema's sense; beyond 2^53 a float is not exact.
    let float = number.as_f64()?;
    (float.fract() == 0.0 && float.abs() <= 9_007_199_254_740_992.0)
        .then(|| Value::from(float as i64))
}

fn parse_number(text: &str) -> Option<Value> {
    parse_integer(text).or_else(|| parse_json_number(text).map(Value::Number))
}

/// A number written exactly as JSON writes one: no `+5`, `.5`, `5.`, `inf`, `NaN`, and
/// nothing out of `f64` range.
fn parse_json_number(text: &str) -> Option<Number> {
    serde_json::from_str::<Number>(text)
        .ok()
        .filter(|number| number.as_f64().is_some_and(f64::is_finite))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read_schema() -> Value {
        json!({"type":"object","required":["path"],"properties":{
            "path":{"type":"string"},
            "offset":{"type":"number"},
            "limit":{"type":"integer"},
            "verbose":{"type":"boolean"}}})
    }

    fn ok(schema: &Value, args: Value) -> Value {
        ValidatorCache::default()
            .validate("t", schema, &args)
            .unwrap_or_else(|e| panic!("expected valid, got:\n{e}"))
    }

    fn err(schema: &Value, args: Value) -> String {
        ValidatorCache::default()
            .validate("t", schema, &args)
            .expect_err("expected a validation error")
    }

    #[test]
    fn strings_become_numbers_integers_and_booleans() {
        let out = ok(
            &read_schema(),
            json!({"path":"a","offset":"5","limit":" 10 ","verbose":"true"}),
        );
        assert_eq!(
            out,
            json!({"path":"a","offset":5,"limit":10,"verbose":true})
        );
        let out = ok(
            &read_schema(),
            json!({"path":"a","offset":"2.5","verbose":"FALSE"}),
        );
        assert_eq!(out, json!({"path":"a","offset":2.5,"verbose":false}));
        let out = ok(&read_schema(), json!({"path":"a","limit":"7.0"}));
        assert_eq!(out, json!({"path":"a","limit":7}));
    }

    #[test]
    fn numbers_and_booleans_become_strings() {
        let out = ok(&read_schema(), json!({"path":42}));
        assert_eq!(out, json!({"path":"42"}));
        let out = ok(&read_schema(), json!({"path":true}));
        assert_eq!(out, json!({"path":"true"}));
        let out = ok(&read_schema(), json!({"path":1.5}));
        assert_eq!(out, json!({"path":"1.5"}));
    }

    #[test]
    fn values_that_are_not_numbers_are_not_coerced() {
        for bad in ["abc", "", "inf", "NaN", "+5", ".5", "5.", "1e999"] {
            let text = err(&read_schema(), json!({"path":"a","offset":bad}));
            assert!(
                text.contains("  - offset: "),
                "{bad:?} should stay a string and fail:\n{text}"
            );
        }
        let text = err(&read_schema(), json!({"path":"a","limit":"2.5"}));
        assert!(
            text.contains("  - limit: \"2.5\" is not of type \"integer\""),
            "{text}"
        );
        let text = err(&read_schema(), json!({"path":"a","verbose":"yes"}));
        assert!(text.contains("  - verbose: "), "{text}");
    }

    #[test]
    fn null_optional_property_is_removed_but_required_null_fails() {
        let out = ok(
            &read_schema(),
            json!({"path":"a","offset":null,"limit":null}),
        );
        assert_eq!(out, json!({"path":"a"}));
        let text = err(&read_schema(), json!({"path":null}));
        assert!(
            text.contains("  - path: null is not of type \"string\""),
            "{text}"
        );
    }

    #[test]
    fn nullable_optional_property_keeps_null() {
        let schema = json!({"type":"object","properties":{"x":{"type":["string","null"]}}});
        assert_eq!(ok(&schema, json!({"x":null})), json!({"x":null}));
    }

    #[test]
    fn null_root_becomes_empty_object() {
        let schema = json!({"type":"object","properties":{"path":{"type":"string"}}});
        assert_eq!(ok(&schema, Value::Null), json!({}));
    }

    #[test]
    fn coercion_reaches_nested_objects_arrays_and_refs() {
        let schema = json!({
            "type":"object",
            "properties":{
                "edits":{"type":"array","items":{"type":"object","required":["line"],
                    "properties":{"line":{"type":"integer"},"note":{"type":"string"}}}},
                "pair":{"type":"array","prefixItems":[{"type":"number"},{"type":"boolean"}]},
                "opts":{"$ref":"#/$defs/Opts"},
                "extra":{"type":"object","additionalProperties":{"type":"number"}},
                "either":{"anyOf":[{"type":"integer"},{"type":"null"}]}
            },
            "$defs":{"Opts":{"type":"object","properties":{"depth":{"type":"integer"}}}}
        });
        let out = ok(
            &schema,
            json!({"edits":[{"line":"3","note":7},{"line":"4","note":null}],
                   "pair":["1.5","true"],"opts":{"depth":"2"},"extra":{"a":"1","b":"2.5"},
                   "either":"9"}),
        );
        assert_eq!(
            out,
            json!({"edits":[{"line":3,"note":"7"},{"line":4}],
                   "pair":[1.5,true],"opts":{"depth":2},"extra":{"a":1,"b":2.5},"either":9})
        );
    }

    #[test]
    fn error_lists_every_violation_with_dot_paths_and_received_arguments() {
        let schema = json!({"type":"object","required":["path","edits"],"properties":{
            "path":{"type":"string"},
            "edits":{"type":"array","items":{"type":"object","required":["oldText","newText"],
                "properties":{"oldText":{"type":"string"},"newText":{"type":"string"}}}}}});
        let args = json!({"edits":[{"oldText":"a"},{"oldText":["x"],"newText":"b"}]});
        let text = ValidatorCache::default()
            .validate("edit", &schema, &args)
            .unwrap_err();
        let expected = concat!(
            "Validation failed for tool \"edit\":\n",
            "  - path: \"path\" is a required property\n",
            "  - edits.0.newText: \"newText\" is a required property\n",
            "  - edits.1.oldText: [\"x\"] is not of type \"string\"\n",
            "\n",
            "Received arguments:\n",
        );
        assert!(text.starts_with(expected), "got:\n{text}");
        assert!(text.ends_with(&serde_json::to_string_pretty(&args).unwrap()));
        assert_eq!(text.matches("\n  - ").count(), 3, "{text}");
    }

    #[test]
    fn root_violations_are_named_root() {
        let text = err(&read_schema(), json!("just a string"));
        assert!(
            text.contains("\n  - root: \"just a string\" is not of type \"object\"\n"),
            "{text}"
        );
    }

    #[test]
    fn received_arguments_are_the_arguments_before_coercion() {
        let text = err(&read_schema(), json!({"offset":"5"}));
        assert!(text.ends_with("{\n  \"offset\": \"5\"\n}"), "{text}");
    }

    #[test]
    fn long_messages_are_cut() {
        let long = "x".repeat(5000);
        let text = err(&read_schema(), json!({"path":"a","verbose":[long]}));
        let line = text.lines().find(|l| l.starts_with("  - verbose")).unwrap();
        assert!(line.chars().count() < MAX_MESSAGE_CHARS + 20, "{line}");
        assert!(line.ends_with('…'));
    }

    #[test]
    fn huge_arguments_are_quoted_by_a_prefix() {
        let schema = json!({
            "type": "object",
            "required": ["path"],
            "properties": {"path": {"type": "string", "maxLength": 4096}}
        });
        let huge = "p".repeat(50_000_000);
        let text = err(&schema, json!({ "path": huge }));
        assert!(text.len() < 2_000, "{} bytes", text.len());
        assert!(text.contains("… (50000000 bytes)"), "{text}");
        assert!(text.contains("  - path: "), "{text}");
    }

    #[test]
    fn violations_are_listed_up_to_a_bound() {
        let schema = json!({"type": "array", "items": {"type": "integer"}});
        let items = vec!["x"; 10_000];
        let text = err(&schema, json!(items));
        assert_eq!(
            text.matches("is not of type").count(),
            MAX_VIOLATIONS,
            "{text}"
        );
        assert!(text.contains("  - … and 9980 more violations"), "{text}");
        assert!(text.len() < 4_000, "{} bytes", text.len());
    }

    #[test]
    fn validators_are_compiled_once_per_tool_and_schema() {
        let cache = ValidatorCache::default();
        let schema = read_schema();
        for i in 0..50 {
            cache
                .validate("read", &schema, &json!({"path": format!("f{i}")}))
                .unwrap();
            let _ = cache.validate("read", &schema, &json!({}));
        }
        assert_eq!(cache.compilations(), 1);
        cache
            .validate("other", &schema, &json!({"path":"a"}))
            .unwrap();
        assert_eq!(cache.compilations(), 2);
        // A changed schema under the same name is recompiled, not validated against the old.
        let stricter = json!({"type":"object","required":["path","mode"]});
        assert!(
            cache
                .validate("read", &stricter, &json!({"path":"a"}))
                .is_err()
        );
        assert_eq!(cache.compilations(), 3);
        cache
            .validate("read", &schema, &json!({"path":"a"}))
            .unwrap();
        assert_eq!(cache.compilations(), 3);
    }

    #[test]
    fn invalid_schema_is_reported_not_panicked() {
        let schema = json!({"type":"object","properties":{"a":{"type":"no-such-type"}}});
        let text = err(&schema, json!({"a":1}));
        assert!(text.contains("parameter schema is invalid"), "{text}");
    }

    #[test]
    fn global_entry_point_validates() {
        assert_eq!(
            validate_tool_arguments("read", &read_schema(), &json!({"path":"a","offset":"3"})),
            Ok(json!({"path":"a","offset":3}))
        );
    }
}
