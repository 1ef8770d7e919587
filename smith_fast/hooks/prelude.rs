// smith-fast Rust hook prelude (HOOKS.md, "Rust hooks").
//
// The service compiles this file as the crate root, with the hook's own source pulled in at the
// end by `include!("hook.rs")`, so diagnostics point at `hook.rs:LINE:COL`. It supplies:
//   * `Json`: a complete JSON value (parser and compact serializer, no crates);
//   * `Action`: what a hook function returns (allow, block with a reason, transform with new data);
//   * `hooks! { before_tool_call, ... }`: the hook registers its functions here (any of
//     before_tool_call, before_shell_exec, after_tool_result, on_shell_output, before_hook_load,
//     before_connect);
//   * `main()`: reads one request per line on stdin ({"trigger": ..., "payload": ...}) and writes one
//     answer per line to the file descriptor named by argv[1] (not stdout: a hook's `println!` goes
//     to the service log with its `eprintln!`, and cannot corrupt the protocol).
// Only `Json`, `Action` and `hooks!` are visible to the hook: everything else lives in
// `__smith_rt`, so a hook may `use` whatever it likes without a name clash.

#![allow(dead_code)]

/// A JSON value. Objects keep their keys in order; integers that fit in an `i64` stay exact.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

/// What a hook function decides.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Let the request (or output) through unchanged.
    Allow,
    /// Stop the request: nothing runs; the reason goes to the frontend.
    Block(String),
    /// Replace the payload; the data must have the same shape as the payload the hook received.
    Transform(Json),
}

impl Action {
    pub fn allow() -> Action {
        Action::Allow
    }
    pub fn block(reason: impl Into<String>) -> Action {
        Action::Block(reason.into())
    }
    pub fn transform(data: Json) -> Action {
        Action::Transform(data)
    }
}

static __SMITH_NULL: Json = Json::Null;

impl Json {
    /// Parses JSON text (RFC 8259). Nesting deeper than 512 levels is an error, not a crash.
    pub fn parse(text: &str) -> Result<Json, String> {
        __smith_rt::parse(text)
    }
    /// An empty object.
    pub fn object() -> Json {
        Json::Object(Vec::new())
    }
    /// An empty array.
    pub fn array() -> Json {
        Json::Array(Vec::new())
    }
    /// An object from `(key, value)` pairs.
    pub fn from_pairs<K: Into<String>>(pairs: Vec<(K, Json)>) -> Json {
        Json::Object(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
    /// The member `key` of an object (`None` for a missing key or a non-object).
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Json> {
        match self {
            Json::Object(members) => members.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
    /// Sets the member `key` of an object, replacing its value or appending it. Panics on a
    /// non-object (a panic fails the call: HOOKS.md, "Failures").
    pub fn set(&mut self, key: &str, value: impl Into<Json>) {
        let value = value.into();
        match self {
            Json::Object(members) => match members.iter_mut().find(|(k, _)| k == key) {
                Some(slot) => slot.1 = value,
                None => members.push((key.to_string(), value)),
            },
            other => panic!("Json::set({:?}) on a non-object: {}", key, other),
        }
    }
    /// Removes and returns the member `key` of an object.
    pub fn remove(&mut self, key: &str) -> Option<Json> {
        match self {
            Json::Object(members) => {
                let i = members.iter().position(|(k, _)| k == key)?;
                Some(members.remove(i).1)
            }
            _ => None,
        }
    }
    /// Appends to an array. Panics on a non-array.
    pub fn push(&mut self, value: impl Into<Json>) {
        match self {
            Json::Array(items) => items.push(value.into()),
            other => panic!("Json::push on a non-array: {}", other),
        }
    }
    pub fn is_null(&self) -> bool {
        matches!(self, Json::Null)
    }
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Json::Int(i) => Some(*i),
            Json::Float(f) if f.fract() == 0.0 && f.abs() < 9.2e18 => Some(*f as i64),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Json::Int(i) => Some(*i as f64),
            Json::Float(f) => Some(*f),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s.as_str()),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&Vec<Json>> {
        match self {
            Json::Array(items) => Some(items),
            _ => None,
        }
    }
    pub fn as_array_mut(&mut self) -> Option<&mut Vec<Json>> {
        match self {
            Json::Array(items) => Some(items),
            _ => None,
        }
    }
    pub fn as_object(&self) -> Option<&Vec<(String, Json)>> {
        match self {
            Json::Object(members) => Some(members),
            _ => None,
        }
    }
    pub fn as_object_mut(&mut self) -> Option<&mut Vec<(String, Json)>> {
        match self {
            Json::Object(members) => Some(members),
            _ => None,
        }
    }
}

/// `value["key"]`: the member, or `Json::Null` when missing (never panics).
impl std::ops::Index<&str> for Json {
    type Output = Json;
    fn index(&self, key: &str) -> &Json {
        self.get(key).unwrap_or(&__SMITH_NULL)
    }
}

/// `value[i]`: the element, or `Json::Null` when out of range or not an array (never panics).
impl std::ops::Index<usize> for Json {
    type Output = Json;
    fn index(&self, i: usize) -> &Json {
        match self {
            Json::Array(items) => items.get(i).unwrap_or(&__SMITH_NULL),
            _ => &__SMITH_NULL,
        }
    }
}

/// Compact JSON text: `value.to_string()`.
impl std::fmt::Display for Json {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut out = String::new();
        __smith_rt::write_json(&mut out, self);
        f.write_str(&out)
    }
}

impl From<&str> for Json {
    fn from(v: &str) -> Json {
        Json::String(v.to_string())
    }
}
impl From<String> for Json {
    fn from(v: String) -> Json {
        Json::String(v)
    }
}
impl From<&String> for Json {
    fn from(v: &String) -> Json {
        Json::String(v.clone())
    }
}
impl From<bool> for Json {
    fn from(v: bool) -> Json {
        Json::Bool(v)
    }
}
impl From<i64> for Json {
    fn from(v: i64) -> Json {
        Json::Int(v)
    }
}
impl From<i32> for Json {
    fn from(v: i32) -> Json {
        Json::Int(v as i64)
    }
}
impl From<u32> for Json {
    fn from(v: u32) -> Json {
        Json::Int(v as i64)
    }
}
impl From<usize> for Json {
    fn from(v: usize) -> Json {
        Json::Int(v as i64)
    }
}
impl From<f64> for Json {
    fn from(v: f64) -> Json {
        Json::Float(v)
    }
}
impl From<Vec<Json>> for Json {
    fn from(v: Vec<Json>) -> Json {
        Json::Array(v)
    }
}
impl<T: Into<Json>> From<Option<T>> for Json {
    fn from(v: Option<T>) -> Json {
        v.map_or(Json::Null, Into::into)
    }
}

/// Registers the hook's functions: `hooks! { before_tool_call, on_shell_output }`. Each name is a
/// trigger and must be a function `fn(&Json) -> Action` in scope.
macro_rules! hooks {
    ($($name:ident),* $(,)?) => {
        fn __smith_dispatch(trigger: &str, payload: &Json) -> Option<Action> {
            match trigger {
                $(stringify!($name) => Some($name(payload)),)*
                _ => None,
            }
        }
        const __SMITH_TRIGGERS: &[&str] = &[$(stringify!($name)),*];
    };
}

mod __smith_rt {
    use super::{Action, Json};
    use std::io::{BufRead, Write};
    use std::sync::Mutex;

    const MAX_DEPTH: usize = 512;

    pub fn parse(text: &str) -> Result<Json, String> {
        let mut p = Parser { s: text.as_bytes(), text, i: 0 };
        p.ws();
        let v = p.value(0)?;
        p.ws();
        if p.i != p.s.len() {
            return Err(p.err("trailing characters"));
        }
        Ok(v)
    }

    struct Parser<'a> {
        s: &'a [u8],
        text: &'a str,
        i: usize,
    }

    impl<'a> Parser<'a> {
        fn err(&self, what: &str) -> String {
            format!("{} at byte {}", what, self.i)
        }
        fn ws(&mut self) {
            while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
                self.i += 1;
            }
        }
        fn eat(&mut self, lit: &[u8]) -> bool {
            if self.s[self.i..].starts_with(lit) {
                self.i += lit.len();
                true
            } else {
                false
            }
        }
        fn value(&mut self, depth: usize) -> Result<Json, String> {
            if depth > MAX_DEPTH {
                return Err(self.err("nesting too deep"));
            }
            match self.s.get(self.i) {
                None => Err(self.err("unexpected end of input")),
                Some(b'{') => self.object(depth),
                Some(b'[') => self.array(depth),
                Some(b'"') => Ok(Json::String(self.string()?)),
                Some(b't') if self.eat(b"true") => Ok(Json::Bool(true)),
                Some(b'f') if self.eat(b"false") => Ok(Json::Bool(false)),
                Some(b'n') if self.eat(b"null") => Ok(Json::Null),
                Some(b'-') | Some(b'0'..=b'9') => self.number(),
                Some(_) => Err(self.err("unexpected character")),
            }
        }
        fn object(&mut self, depth: usize) -> Result<Json, String> {
            self.i += 1;
            let mut members = Vec::new();
            self.ws();
            if self.eat(b"}") {
                return Ok(Json::Object(members));
            }
            loop {
                self.ws();
                if self.s.get(self.i) != Some(&b'"') {
                    return Err(self.err("expected a string key"));
                }
                let key = self.string()?;
                self.ws();
                if !self.eat(b":") {
                    return Err(self.err("expected ':'"));
                }
                self.ws();
                let value = self.value(depth + 1)?;
                members.push((key, value));
                self.ws();
                if self.eat(b",") {
                    continue;
                }
                if self.eat(b"}") {
                    return Ok(Json::Object(members));
                }
                return Err(self.err("expected ',' or '}'"));
            }
        }
        fn array(&mut self, depth: usize) -> Result<Json, String> {
            self.i += 1;
            let mut items = Vec::new();
            self.ws();
            if self.eat(b"]") {
                return Ok(Json::Array(items));
            }
            loop {
                self.ws();
                items.push(self.value(depth + 1)?);
                self.ws();
                if self.eat(b",") {
                    continue;
                }
                if self.eat(b"]") {
                    return Ok(Json::Array(items));
                }
                return Err(self.err("expected ',' or ']'"));
            }
        }
        fn hex4(&mut self) -> Result<u32, String> {
            let digits = self.s.get(self.i..self.i + 4).ok_or_else(|| self.err("truncated \\u escape"))?;
            let mut v = 0u32;
            for &d in digits {
                v = v * 16
                    + match d {
                        b'0'..=b'9' => (d - b'0') as u32,
                        b'a'..=b'f' => (d - b'a' + 10) as u32,
                        b'A'..=b'F' => (d - b'A' + 10) as u32,
                        _ => return Err(self.err("bad \\u escape")),
                    };
            }
            self.i += 4;
            Ok(v)
        }
        fn string(&mut self) -> Result<String, String> {
            self.i += 1;
            let mut out = String::new();
            loop {
                let start = self.i;
                while self.i < self.s.len() && !matches!(self.s[self.i], b'"' | b'\\' | 0..=0x1f) {
                    self.i += 1;
                }
                // `start` and `i` sit on ASCII bytes, so this slice is valid UTF-8.
                out.push_str(&self.text[start..self.i]);
                match self.s.get(self.i) {
                    None => return Err(self.err("unterminated string")),
                    Some(b'"') => {
                        self.i += 1;
                        return Ok(out);
                    }
                    Some(b'\\') => {
                        self.i += 1;
                        let c = *self.s.get(self.i).ok_or_else(|| self.err("unterminated string"))?;
                        self.i += 1;
                        match c {
                            b'"' => out.push('"'),
                            b'\\' => out.push('\\'),
                            b'/' => out.push('/'),
                            b'b' => out.push('\u{8}'),
                            b'f' => out.push('\u{c}'),
                            b'n' => out.push('\n'),
                            b'r' => out.push('\r'),
                            b't' => out.push('\t'),
                            b'u' => {
                                let hi = self.hex4()?;
                                let code = if (0xD800..0xDC00).contains(&hi) && self.s[self.i..].starts_with(b"\\u") {
                                    let save = self.i;
                                    self.i += 2;
                                    let lo = self.hex4()?;
                                    if (0xDC00..0xE000).contains(&lo) {
                                        0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                                    } else {
                                        self.i = save;
                                        hi
                                    }
                                } else {
                                    hi
                                };
                                // A lone surrogate cannot be in a Rust String: U+FFFD stands in.
                                out.push(char::from_u32(code).unwrap_or('\u{FFFD}'));
                            }
                            _ => return Err(self.err("bad escape")),
                        }
                    }
                    Some(_) => return Err(self.err("control character in string")),
                }
            }
        }
        fn number(&mut self) -> Result<Json, String> {
            let start = self.i;
            let digits = |p: &mut Parser| {
                let from = p.i;
                while p.i < p.s.len() && p.s[p.i].is_ascii_digit() {
                    p.i += 1;
                }
                p.i - from
            };
            self.eat(b"-");
            let int_start = self.i;
            let n = digits(self);
            if n == 0 || (n > 1 && self.s[int_start] == b'0') {
                return Err(self.err("bad number"));
            }
            let mut integral = true;
            if self.eat(b".") {
                integral = false;
                if digits(self) == 0 {
                    return Err(self.err("bad number"));
                }
            }
            if self.i < self.s.len() && matches!(self.s[self.i], b'e' | b'E') {
                integral = false;
                self.i += 1;
                if self.i < self.s.len() && matches!(self.s[self.i], b'+' | b'-') {
                    self.i += 1;
                }
                if digits(self) == 0 {
                    return Err(self.err("bad number"));
                }
            }
            let text = &self.text[start..self.i];
            if integral {
                if let Ok(v) = text.parse::<i64>() {
                    return Ok(Json::Int(v));
                }
            }
            text.parse::<f64>().map(Json::Float).map_err(|_| self.err("bad number"))
        }
    }

    pub fn write_str(out: &mut String, s: &str) {
        out.push('"');
        let bytes = s.as_bytes();
        let mut start = 0;
        for (i, &b) in bytes.iter().enumerate() {
            let esc: Option<&str> = match b {
                b'"' => Some("\\\""),
                b'\\' => Some("\\\\"),
                b'\n' => Some("\\n"),
                b'\r' => Some("\\r"),
                b'\t' => Some("\\t"),
                0..=0x1f => None,
                _ => continue,
            };
            out.push_str(&s[start..i]);
            match esc {
                Some(e) => out.push_str(e),
                None => out.push_str(&format!("\\u{:04x}", b)),
            }
            start = i + 1;
        }
        out.push_str(&s[start..]);
        out.push('"');
    }

    pub fn write_json(out: &mut String, v: &Json) {
        match v {
            Json::Null => out.push_str("null"),
            Json::Bool(true) => out.push_str("true"),
            Json::Bool(false) => out.push_str("false"),
            Json::Int(i) => out.push_str(&i.to_string()),
            // `{:?}` prints the shortest text that reads back as the same f64 ("1.0", "1e-7").
            Json::Float(f) if f.is_finite() => out.push_str(&format!("{:?}", f)),
            Json::Float(_) => out.push_str("null"),
            Json::String(s) => write_str(out, s),
            Json::Array(items) => {
                out.push('[');
                for (n, item) in items.iter().enumerate() {
                    if n > 0 {
                        out.push(',');
                    }
                    write_json(out, item);
                }
                out.push(']');
            }
            Json::Object(members) => {
                out.push('{');
                for (n, (k, item)) in members.iter().enumerate() {
                    if n > 0 {
                        out.push(',');
                    }
                    write_str(out, k);
                    out.push(':');
                    write_json(out, item);
                }
                out.push('}');
            }
        }
    }

    static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

    fn error(out: &mut String, message: &str) {
        out.push_str("{\"error\":");
        write_str(out, message);
        out.push('}');
    }

    fn answer(out: &mut String, line: &str, triggers: &[&str], dispatch: fn(&str, &Json) -> Option<Action>) {
        let request = match parse(line.trim_end()) {
            Ok(r) => r,
            Err(e) => return error(out, &format!("bad request: {}", e)),
        };
        let trigger = request["trigger"].as_str().unwrap_or("");
        if trigger == "__describe__" {
            let names: Vec<Json> = triggers.iter().map(|t| Json::from(*t)).collect();
            out.push_str("{\"triggers\":");
            write_json(out, &Json::Array(names));
            out.push('}');
            return;
        }
        let payload = &request["payload"];
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dispatch(trigger, payload)));
        match result {
            Ok(Some(Action::Allow)) => out.push_str("{\"action\":\"allow\"}"),
            Ok(Some(Action::Block(reason))) => {
                out.push_str("{\"action\":\"block\",\"reason\":");
                write_str(out, &reason);
                out.push('}');
            }
            Ok(Some(Action::Transform(data))) => {
                out.push_str("{\"action\":\"transform\",\"data\":");
                write_json(out, &data);
                out.push('}');
            }
            Ok(None) => error(out, &format!("the hook does not define {}", trigger)),
            Err(_) => {
                let message = LAST_PANIC.lock().map(|mut m| m.take()).unwrap_or(None);
                error(out, &format!("panicked: {}", message.unwrap_or_else(|| "(no message)".into())))
            }
        }
    }

    pub fn main(triggers: &[&str], dispatch: fn(&str, &Json) -> Option<Action>) {
        use std::os::unix::io::FromRawFd;
        let fd: i32 = match std::env::args().nth(1).and_then(|a| a.parse().ok()) {
            Some(fd) => fd,
            None => {
                eprintln!("usage: hook RESPONSE_FD (this program is run by smith-fast)");
                std::process::exit(2);
            }
        };
        // SAFETY: the service opened `fd` for this process and nothing else in it uses that number.
        let mut responses = unsafe { std::fs::File::from_raw_fd(fd) };
        std::panic::set_hook(Box::new(|info| {
            let payload = info.payload();
            let text = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(non-string panic payload)".into());
            let text = match info.location() {
                Some(l) => format!("{} at {}:{}:{}", text, l.file(), l.line(), l.column()),
                None => text,
            };
            if let Ok(mut slot) = LAST_PANIC.lock() {
                *slot = Some(text);
            }
        }));
        let stdin = std::io::stdin();
        let mut input = stdin.lock();
        let mut line = String::new();
        let mut out = String::new();
        loop {
            line.clear();
            match input.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            out.clear();
            answer(&mut out, &line, triggers, dispatch);
            out.push('\n');
            if responses.write_all(out.as_bytes()).is_err() {
                return;
            }
        }
    }
}

fn main() {
    __smith_rt::main(__SMITH_TRIGGERS, __smith_dispatch)
}

include!("hook.rs");
