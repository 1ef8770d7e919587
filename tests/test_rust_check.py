"""The token-level check of a session's Rust hook (smith_fast/hooks/rust_check.py).

Each refused source is one way to read a file while compiling, run code before ``main`` or reach
the system, dressed so that a search over the text would miss it; each accepted one puts the same
words where the compiler sees no token (comments, strings), so the check refuses by tokens, not by
text.
"""

from __future__ import annotations

import pytest

from smith_fast.hooks import HookLoadError
from smith_fast.hooks.rust_check import check_rust_source, rust_tokens

TAIL = "\nfn before_tool_call(_p: &Json) -> Action { Action::Allow }\nhooks! { before_tool_call }\n"

REFUSED = {
    "include_str": ('const LEAK: &str = include_str!("/etc/shadow");', "include_str"),
    "include_bytes": ('const LEAK: &[u8] = include_bytes!("/etc/shadow");', "include_bytes"),
    "include": ('include!("/etc/passwd");', "`include`"),
    "env macro": ('const HOME: &str = env!("HOME");', "`env`"),
    "option_env": ('const T: Option<&str> = option_env!("SMITH_TOKEN");', "option_env"),
    "init_array": ('#[used]\n#[link_section = ".init_array"]\nstatic INIT: extern "C" fn() = init;', "attribute `used`"),
    "no_mangle": ("#[no_mangle]\npub fn main2() {}", "attribute `no_mangle`"),
    "export_name": ('#[export_name = "main"]\npub fn m() {}', "attribute `export_name`"),
    "path attribute": ('#[path = "/etc/passwd"]\nmod m;', "attribute `path`"),
    "cfg_attr wraps one": ('#[cfg_attr(all(), link_section = ".init_array")]\nstatic X: u8 = 0;', "attribute `cfg_attr`"),
    "crate attribute": ("#![no_main]", "crate attributes"),
    "extern block": ('extern "C" { fn system(c: *const u8) -> i32; }', "`extern`"),
    "unsafe": ("fn f() { unsafe {} }", "`unsafe`"),
    "asm": ('fn f() { core::arch::asm!("nop"); }', "`asm`"),
    "global_asm": ('core::arch::global_asm!(".section .init_array");', "global_asm"),
    "std::process": ('fn f() { let _ = std::process::Command::new("sh").status(); }', "`process`"),
    "use as": ("use std::process as p;", "`process`"),
    "std::fs": ('fn f() -> String { std::fs::read_to_string("/etc/shadow").unwrap() }', "`fs`"),
    "std::env": ('fn f() -> String { std::env::var("HOME").unwrap() }', "`env`"),
    "std::net": ('fn f() { let _ = std::net::TcpStream::connect("1.2.3.4:80"); }', "`net`"),
    "thread": ("fn f() { std::thread::spawn(|| loop {}); }", "`thread`"),
    "raw identifier": ('const L: &str = r#include_str!("/etc/shadow");', "include_str"),
    "macro argument": ('macro_rules! m { ($i:ident) => { $i!("/etc/shadow") } }\nconst L: &str = m!(include_str);', "include_str"),
    "# handed to a macro": ('macro_rules! m { ($h:tt , $b:tt) => { $h $b static X: u8 = 0; } }\nm!(# , [link_section = ".init_array"]);', "`#` only starts an attribute"),
    "attribute from fragments": ("macro_rules! m { ($a:meta) => { #[$a] static X: u8 = 0; } }", "attribute `$`"),
    "module file": ("mod other;", "module without a body"),
    "prelude internals": ('fn f() { let _ = __smith_rt::parse("1"); }', "__smith_rt"),
    "kelvin sign": ('#[lin\u212a_section = ".init_array"] static X: u8 = 0;', "ASCII"),
    "after a char literal that looks like a quote": ("fn f() -> char { let c = '\"'; c } const L: &str = include_str!(\"/x\");", "include_str"),
    "after a byte string with an escaped quote": ('const B: &[u8] = b"\\""; const L: &str = include_str!("/x");', "include_str"),
    "after a raw string with hashes": ('const R: &str = r##"a "# b"##; const L: &str = include_str!("/x");', "include_str"),
    "after a nested comment": ('/* a /* b */ c */ const L: &str = include_str!("/x");', "include_str"),
    "after a lifetime": ("fn f<'a>(s: &'a str) -> &'a str { s } const L: &str = include_str!(\"/x\");", "include_str"),
    "unterminated comment hides the rest": ("/* include_str", "unterminated block comment"),
}

ACCEPTED = {
    "words in comments": '// include_str!("/etc/shadow") #[used] std::process\n/* #[link_section] /* unsafe */ */',
    "words in strings": 'const S: &str = "include_str!(\\"/etc/shadow\\") #[used] unsafe";',
    "words in raw strings": 'const S: &str = r##"include_str!("/etc/shadow") "# fs"##;',
    "characters and lifetimes": "fn f<'a>(s: &'a str) -> (char, char, u8, &'a str) { ('#', '\\'', b'\\\\', s) }",
    "allowed attributes": "#[derive(Debug, Clone)]\n#[allow(dead_code)]\nstruct S { a: u8 }\n#[inline]\nfn g() {}",
    "doc comments": "/// A helper.\n//! inner doc\nfn h() {}",
    "a module with a body": "mod util { pub fn f() -> u8 { 1 } }",
    "std collections and sync": "use std::collections::BTreeMap;\nuse std::sync::atomic::{AtomicU64, Ordering};\nstatic N: AtomicU64 = AtomicU64::new(0);",
    "unicode in strings": 'const S: &str = "é \u212a ☃";',
    "numbers and ranges": "fn f() -> usize { (0..10).map(|i| i * 2).sum::<usize>() + 1_000 + 0xff + 1.5e3 as usize }",
}


@pytest.mark.parametrize("source,why", list(REFUSED.values()), ids=list(REFUSED))
def test_refused(source: str, why: str) -> None:
    with pytest.raises(HookLoadError) as info:
        check_rust_source(source + TAIL)
    assert why in str(info.value) and "hook.rs:" in str(info.value)


@pytest.mark.parametrize("source", list(ACCEPTED.values()), ids=list(ACCEPTED))
def test_accepted(source: str) -> None:
    check_rust_source(source + TAIL)


def test_tokens_see_what_the_compiler_sees() -> None:
    tokens = rust_tokens('let r#fn = r#"x"#; // c\n/* d */ b"y" \'z\' \'a')
    assert [(k, t) for k, t, _ in tokens] == [
        ("ident", "let"), ("ident", "fn"), ("punct", "="), ("literal", 'r#"x"#'), ("punct", ";"),
        ("literal", 'b"y"'), ("literal", "'z'"), ("punct", "'"),
    ]  # fmt: skip


def test_the_position_is_reported() -> None:
    with pytest.raises(HookLoadError, match=r"hook\.rs:3:17: `include_str`"):
        check_rust_source('// one\n// two\nconst L: &str = include_str!("/x");')
