//! A pool's tokenizer and chat template against the reference libraries:
//! `tests/tokenizer/reference.py` builds a test tokenizer (BPE, byte-level,
//! special tokens, a post-processor) and a ChatML-like template with
//! tools, `tojson`, loop controls, `raise_exception` and Python string
//! methods, and writes what Hugging Face `tokenizers` and Jinja (set up as
//! `transformers` sets it up) make of a set of conversations. Fairway's
//! rendering and ids must equal theirs. Needs the Python venv that
//! `tests/run.sh` makes (`target/sdk-venv`, with `tokenizers` and
//! `jinja2`); no downloads.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::PathBuf;

use fairway::fault::Chain;
use fairway::tokens::ChatTokenizer;
use serde_json::{Value, json};

async fn reference() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let python = std::env::var_os("FAIRWAY_SDK_PYTHON")
        .map_or_else(|| root.join("target/sdk-venv/bin/python"), Into::into);
    assert!(
        python.exists(),
        "CI must install the reference libraries (tests/run.sh makes target/sdk-venv)"
    );
    let dir = tempfile::tempdir().unwrap().keep();
    let (ok, out) = support::run_python(
        python,
        root.join("tests/tokenizer/reference.py"),
        vec![dir.clone().into()],
    )
    .await;
    assert!(ok, "{out}");
    dir
}

fn load(dir: &std::path::Path) -> ChatTokenizer {
    ChatTokenizer::load(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
        None,
    )
    .unwrap()
}

#[tokio::test]
async fn rendering_and_ids_equal_the_reference_libraries() {
    let dir = reference().await;
    let tok = load(&dir);
    assert!(tok.has_template());
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    for (i, chat) in expected["chats"].as_array().unwrap().iter().enumerate() {
        let agp = chat["add_generation_prompt"].as_bool().unwrap_or(true);
        let messages = chat["wire"]["messages"].as_str().unwrap();
        let tools = chat["wire"]["tools"].as_str();
        let text = tok.render(messages, tools, agp).unwrap();
        assert_eq!(text, chat["text"].as_str().unwrap(), "chat {i}: rendering");
        let want: Vec<u32> = serde_json::from_value(chat["ids"].clone()).unwrap();
        assert_eq!(tok.encode(&text).unwrap(), want, "chat {i}: ids");
        // The same through a request body, twice (the second from the
        // cache of pieces).
        let body = format!(
            r#"{{"model":"m","messages":{messages},"tools":{},"add_generation_prompt":{agp}}}"#,
            tools.unwrap_or("null")
        );
        for _ in 0..2 {
            assert_eq!(
                tok.prompt_ids(body.as_bytes()).unwrap().ids,
                want,
                "chat {i}: body"
            );
        }
    }
    for c in expected["completions"].as_array().unwrap() {
        let want: Vec<u32> = serde_json::from_value(c["ids"].clone()).unwrap();
        let body = json!({"model": "m", "prompt": c["prompt"]}).to_string();
        assert_eq!(tok.prompt_ids(body.as_bytes()).unwrap().ids, want, "{c}");
    }
    // A prompt of ids is taken as it is.
    let body = json!({"model": "m", "prompt": [5, 6, 7], "cache_salt": "s"}).to_string();
    let got = tok.prompt_ids(body.as_bytes()).unwrap();
    assert_eq!(
        (got.ids, got.cache_salt.as_deref()),
        (vec![5, 6, 7], Some("s"))
    );
}

#[tokio::test]
async fn what_the_template_refuses_falls_back_and_bad_files_are_named() {
    let dir = reference().await;
    let tok = load(&dir);
    // raise_exception: no ids (the gateway then keys the bytes).
    let body = json!({"model": "m", "messages": [{"role": "robot", "content": "hi"}]}).to_string();
    assert_eq!(tok.prompt_ids(body.as_bytes()), None);
    assert!(
        Chain(
            &tok.render(r#"[{"role":"robot","content":"x"}]"#, None, true)
                .unwrap_err()
        )
        .to_string()
        .contains("unknown role robot")
    );
    // A template of its own file replaces the config's.
    let own = dir.join("own.jinja");
    std::fs::write(
        &own,
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}",
    )
    .unwrap();
    let t = ChatTokenizer::load(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
        Some(&own),
    )
    .unwrap();
    assert_eq!(
        t.render(r#"[{"role":"user","content":"hi"}]"#, None, true)
            .unwrap(),
        "[user] hi\n"
    );
    // Errors name the file.
    let broken = dir.join("broken.jinja");
    std::fs::write(&broken, "{% for m in messages %}").unwrap();
    let e = ChatTokenizer::load(&dir.join("tokenizer.json"), None, Some(&broken)).unwrap_err();
    let e = e.to_string();
    assert!(
        e.contains("broken.jinja") && e.contains("does not compile"),
        "{e}"
    );
    let e = ChatTokenizer::load(&dir.join("missing.json"), None, None).unwrap_err();
    let e = e.to_string();
    assert!(e.contains("missing.json"), "{e}");
    // Without a template, a chat has no ids; a completion still does.
    let t = ChatTokenizer::load(&dir.join("tokenizer.json"), None, None).unwrap();
    assert!(!t.has_template());
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    assert_eq!(t.prompt_ids(chat.as_bytes()), None);
    let completion = json!({"model": "m", "prompt": "hi"}).to_string();
    assert!(t.prompt_ids(completion.as_bytes()).is_some());
}
