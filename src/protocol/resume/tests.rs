use super::*;
use proptest::prelude::*;

/// A vLLM-like stream of `tokens` (text, id): the prompt's ids on the first
/// chunk when `first`; cut by a preemption, or ending with its finish
/// reason, usage (`prompt` counted) and `[DONE]`.
fn stream(
    kind: Kind,
    prompt: &[u64],
    tokens: &[(String, u64)],
    end: Option<&str>,
    first: bool,
) -> Vec<u8> {
    let mut out = String::new();
    let chunk = |choice: Value, extra: Option<(&str, Value)>| {
        let mut c = json!({"id": "cmpl-1", "created": 7, "model": "m", "choices": [choice]});
        if let Some((k, v)) = extra {
            c[k] = v;
        }
        format!("data: {c}\n\n")
    };
    let ids = first.then(|| ("prompt_token_ids", json!(prompt)));
    if kind == Kind::Chat {
        out += &chunk(
            json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}),
            ids.clone(),
        );
    }
    for (i, (t, id)) in tokens.iter().enumerate() {
        let finish = if i + 1 == tokens.len() { end } else { None };
        let mut choice = match kind {
            Kind::Chat => json!({"index": 0, "delta": {"content": t}, "token_ids": [id],
                "finish_reason": finish}),
            Kind::Completions => json!({"index": 0, "text": t, "token_ids": [id],
                "finish_reason": finish}),
        };
        if kind == Kind::Completions && i == 0 && first {
            // vLLM puts them on a completion's choice.
            choice["prompt_token_ids"] = json!(prompt);
        }
        out += &chunk(choice, None);
    }
    match end {
        Some(_) => {
            let u = json!({"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": prompt.len(),
                "completion_tokens": tokens.len(), "total_tokens": prompt.len() + tokens.len()}});
            out += &format!("data: {u}\n\ndata: [DONE]\n\n");
        }
        None => out += &String::from_utf8_lossy(&crate::protocol::openai::preempted_event()),
    }
    out.into_bytes()
}

fn tokens(texts: &[&str]) -> Vec<(String, u64)> {
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| ((*t).to_owned(), 100 + i as u64))
        .collect()
}

fn chat_item(max: u64) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max,
        "temperature": 0.7, "min_tokens": 3, "stop": ["END"]})
}

#[test]
fn a_chat_item_cut_twice_resumes_by_token_ids_and_answers_as_one_call() {
    let item = chat_item(6);
    let all = tokens(&["a", "b", "c", "d", "e", "f"]);
    let mut p = Progress::default();
    assert_eq!(
        p.read(&stream(Kind::Chat, &[1, 2, 3], &all[..2], None, true)),
        Ended::Preempted
    );
    let c: Value = serde_json::from_slice(&p.continuation(&item).unwrap()).unwrap();
    assert_eq!(c["prompt"], json!([1, 2, 3, 100, 101]));
    assert_eq!(c["max_tokens"], 4);
    assert_eq!(c["min_tokens"], 1);
    assert_eq!(c["temperature"], 0.7);
    assert_eq!(c["add_special_tokens"], false);
    assert!(c.get("messages").is_none(), "{c}");
    let cont = |t: &[(String, u64)], end| stream(Kind::Completions, &[9; 5], t, end, false);
    assert_eq!(p.read(&cont(&all[2..3], None)), Ended::Preempted);
    let c: Value = serde_json::from_slice(&p.continuation(&item).unwrap()).unwrap();
    assert_eq!(c["max_tokens"], 3);
    assert_eq!(c["min_tokens"], 0);
    assert_eq!(p.read(&cont(&all[3..], Some("length"))), Ended::Done);
    let a: Value = serde_json::from_slice(&p.answer(Kind::Chat, &item)).unwrap();
    assert_eq!(a["object"], "chat.completion");
    assert_eq!(a["id"], "cmpl-1");
    assert_eq!(a["choices"][0]["message"]["content"], "abcdef");
    assert_eq!(a["choices"][0]["message"]["role"], "assistant");
    assert_eq!(a["choices"][0]["finish_reason"], "length");
    assert_eq!(
        a["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9})
    );
}

#[test]
fn a_stream_read_in_pieces_and_kept_mid_answer_continues_as_one_call() {
    let item = chat_item(6);
    let all = tokens(&["a", "b", "c", "d", "e", "f"]);
    let body = stream(Kind::Chat, &[1, 2, 3], &all, Some("length"), true);
    // Fed in pieces of 7 bytes, kept (serialized) after the third token,
    // as a checkpoint is, and read back as another gateway would.
    let mut p = Progress::default();
    p.begin();
    let mut buf = Vec::new();
    let mut kept = None;
    for piece in body.chunks(7) {
        buf.extend_from_slice(piece);
        let n = p.feed(&buf).unwrap();
        buf.drain(..n);
        if kept.is_none() && p.generated() >= 3 {
            kept = Some(serde_json::to_vec(&p).unwrap());
        }
    }
    assert_eq!(p.end(&buf), Ended::Done);
    let whole: Value = serde_json::from_slice(&p.answer(Kind::Chat, &item)).unwrap();
    let mut read = Progress::default();
    assert_eq!(read.read(&body), Ended::Done);
    assert_eq!(read.answer(Kind::Chat, &item), p.answer(Kind::Chat, &item));
    // The kept progress continues from its three tokens, and its answer
    // is the uninterrupted one's.
    let mut q: Progress = serde_json::from_slice(&kept.unwrap()).unwrap();
    assert_eq!(q.generated(), 3);
    let c: Value = serde_json::from_slice(&q.continuation(&item).unwrap()).unwrap();
    assert_eq!(c["prompt"], json!([1, 2, 3, 100, 101, 102]));
    assert_eq!(c["max_tokens"], 3);
    let rest = stream(Kind::Completions, &[9; 6], &all[3..], Some("length"), false);
    assert_eq!(q.read(&rest), Ended::Done);
    let resumed: Value = serde_json::from_slice(&q.answer(Kind::Chat, &item)).unwrap();
    assert_eq!(resumed["choices"], whole["choices"]);
    assert_eq!(resumed["usage"], whole["usage"]);
}

#[test]
fn a_stop_string_across_a_seam_ends_the_answer_there() {
    let item = chat_item(10);
    let mut p = Progress::default();
    p.read(&stream(Kind::Chat, &[1], &tokens(&["x", "E"]), None, true));
    p.continuation(&item).unwrap();
    p.read(&stream(
        Kind::Completions,
        &[1, 100, 101],
        &tokens(&["ND", "y"]),
        Some("length"),
        false,
    ));
    let a: Value = serde_json::from_slice(&p.answer(Kind::Chat, &item)).unwrap();
    assert_eq!(a["choices"][0]["message"]["content"], "x");
    assert_eq!(a["choices"][0]["finish_reason"], "stop");
    assert_eq!(a["choices"][0]["stop_reason"], "END");
    // Within one attempt, the engine's own match stands.
    let mut p = Progress::default();
    p.read(&stream(
        Kind::Chat,
        &[1],
        &tokens(&["xENDy"]),
        Some("length"),
        true,
    ));
    let a: Value = serde_json::from_slice(&p.answer(Kind::Chat, &item)).unwrap();
    assert_eq!(a["choices"][0]["message"]["content"], "xENDy");
}

#[test]
fn what_cannot_resume_exactly_is_refused_by_name() {
    let chat = "/v1/chat/completions";
    let with = |k: &str, v: Value| {
        let mut b = chat_item(5);
        b[k] = v;
        resumable(chat, &b)
    };
    assert_eq!(resumable(chat, &chat_item(5)), Ok(Kind::Chat));
    assert_eq!(with("n", json!(2)), Err("n"));
    assert_eq!(with("n", json!(1)), Ok(Kind::Chat));
    assert_eq!(with("tools", json!([{"type": "function"}])), Err("tools"));
    assert_eq!(
        with("response_format", json!({"type": "json_object"})),
        Err("structured output")
    );
    assert_eq!(
        with("response_format", json!({"type": "text"})),
        Ok(Kind::Chat)
    );
    assert_eq!(with("logprobs", json!(true)), Err("logprobs"));
    assert_eq!(with("frequency_penalty", json!(0.5)), Err("penalties"));
    assert_eq!(with("presence_penalty", json!(0)), Ok(Kind::Chat));
    assert_eq!(
        with(
            "messages",
            json!([{"role": "user", "content": [{"type": "image_url"}]}])
        ),
        Err("media")
    );
    let mut b = chat_item(5);
    b.as_object_mut().unwrap().remove("max_tokens");
    assert_eq!(resumable(chat, &b), Err("max_tokens"));
    let c = "/v1/completions";
    assert_eq!(
        resumable(c, &json!({"model": "m", "prompt": "x"})),
        Ok(Kind::Completions)
    );
    assert_eq!(
        resumable(c, &json!({"model": "m", "prompt": [1, 2]})),
        Ok(Kind::Completions)
    );
    assert_eq!(
        resumable(c, &json!({"model": "m", "prompt": ["a", "b"]})),
        Err("prompt")
    );
    assert_eq!(resumable("/v1/embeddings", &json!({})), Err("endpoint"));
}

#[test]
fn a_stream_without_token_ids_or_with_reasoning_restarts_instead() {
    let item = chat_item(5);
    let mut p = Progress::default();
    let plain =
        b"data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n";
    let mut body = plain.to_vec();
    body.extend_from_slice(&crate::protocol::openai::preempted_event());
    assert_eq!(p.read(&body), Ended::Preempted);
    assert!(p.continuation(&item).is_none());
    let mut p = Progress::default();
    let r = b"data: {\"id\":\"a\",\"prompt_token_ids\":[1],\"choices\":[{\"index\":0,\
        \"delta\":{\"reasoning_content\":\"hm\"},\"token_ids\":[5]}]}\n\n";
    let mut body = r.to_vec();
    body.extend_from_slice(&crate::protocol::openai::preempted_event());
    assert_eq!(p.read(&body), Ended::Preempted);
    assert!(p.continuation(&item).is_none());
}

#[test]
fn a_broken_stream_is_not_an_answer() {
    let mut p = Progress::default();
    let t = tokens(&["a"]);
    let mut s = stream(Kind::Completions, &[1], &t, Some("stop"), true);
    s.truncate(s.len() / 3);
    assert!(matches!(p.read(&s), Ended::Broken(_)));
    let e = crate::protocol::openai::error_event("reset");
    assert!(matches!(Progress::default().read(&e), Ended::Broken(_)));
}

proptest! {
    /// However an answer is cut into attempts, the stitched answer is the
    /// uninterrupted one: its text, its token count, the original prompt,
    /// the last finish reason; each continuation asks for exactly what is
    /// left.
    #[test]
    fn any_cuts_stitch_to_the_uninterrupted_answer(
        texts in proptest::collection::vec("[a-z ]{0,3}", 1..40),
        cuts in proptest::collection::btree_set(1usize..40, 0..6),
        chat in any::<bool>(),
        prompt in proptest::collection::vec(0u64..50_000, 1..20),
    ) {
        let kind = if chat { Kind::Chat } else { Kind::Completions };
        let all: Vec<(String, u64)> =
            texts.iter().enumerate().map(|(i, t)| (t.clone(), i as u64)).collect();
        let max = all.len() as u64;
        let item = match kind {
            Kind::Chat => json!({"model": "m", "messages": [], "max_tokens": max}),
            Kind::Completions => json!({"model": "m", "prompt": "p", "max_tokens": max}),
        };
        let mut bounds: Vec<usize> = cuts.into_iter().filter(|&c| c < all.len()).collect();
        bounds.push(all.len());
        let mut p = Progress::default();
        let mut from = 0;
        let mut sent_prompt = prompt.clone();
        for (n, &to) in bounds.iter().enumerate() {
            let last = n + 1 == bounds.len();
            let (k, first) = if n == 0 { (kind, true) } else { (Kind::Completions, false) };
            let body = stream(k, &sent_prompt, &all[from..to], last.then_some("length"), first);
            let ended = p.read(&body);
            if last {
                prop_assert_eq!(ended, Ended::Done);
            } else {
                prop_assert_eq!(ended, Ended::Preempted);
                let c: Value = serde_json::from_slice(&p.continuation(&item).unwrap()).unwrap();
                let mut want = prompt.clone();
                want.extend(all[..to].iter().map(|t| t.1));
                prop_assert_eq!(&c["prompt"], &json!(want));
                prop_assert_eq!(c["max_tokens"].as_u64(), Some(max - to as u64));
                sent_prompt = want;
            }
            from = to;
        }
        let a: Value = serde_json::from_slice(&p.answer(kind, &item)).unwrap();
        let text: String = texts.concat();
        let got = match kind {
            Kind::Chat => &a["choices"][0]["message"]["content"],
            Kind::Completions => &a["choices"][0]["text"],
        };
        prop_assert_eq!(got, &json!(text));
        prop_assert_eq!(&a["usage"]["prompt_tokens"], &json!(prompt.len()));
        prop_assert_eq!(&a["usage"]["completion_tokens"], &json!(max));
        prop_assert_eq!(&a["choices"][0]["finish_reason"], &json!("length"));
    }
}
