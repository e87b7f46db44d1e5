//! `GET /stream`: the event log as Server-Sent Events, from a sequence number on, so a client
//! that reconnects (`Last-Event-ID`) or starts from a snapshot never re-downloads everything.
//!
//! Pushed, not polled: an idle stream waits on the store's change signal (the writer's commit
//! watch, or file notifications for a store another process writes) and reads the log only
//! when it changed.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::{self, Stream};
use tokio::sync::watch;

use super::reads::{number_param, params, QueryParams};
use super::{ApiError, ApiState};
use crate::store::EventSeq;

/// Most events read from the store at once.
const BATCH: u64 = 1_000;

struct Cursor {
    state: ApiState,
    after: u64,
    pending: VecDeque<Event>,
    /// Changes when the store may hold new events (see `ApiConfig::commits`).
    changes: watch::Receiver<EventSeq>,
    /// The last read failed: read again only after the store's next change.
    failed: bool,
    /// `event: end` was sent.
    end_sent: bool,
    /// The store is gone (deleted or moved, a 410): its `error` event was sent, and the stream
    /// ends, as nothing of it can come any more.
    gone: bool,
    /// Counts this response among the open ones while it lives.
    _open: OpenStream,
}

impl Cursor {
    /// Waits for the store's next change; false when nothing can change any more (the writer
    /// is gone).
    async fn next_change(&mut self) -> bool {
        self.changes.changed().await.is_ok()
    }
}

/// One open `/stream` response, counted in `ApiState::streams_closed` until dropped (the
/// client left, or the server ends).
struct OpenStream(ApiState);

impl OpenStream {
    fn new(state: ApiState) -> OpenStream {
        state.inner.open_streams.send_modify(|open| *open += 1);
        OpenStream(state)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.inner.open_streams.send_modify(|open| *open -= 1);
    }
}

pub(super) async fn stream(
    State(state): State<ApiState>,
    headers: HeaderMap,
    query: QueryParams,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let params = params(query)?;
    let reconnected_after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let after = match reconnected_after {
        Some(seq) => seq,
        None => number_param(&params, "since")?.unwrap_or(0),
    };
    // A store gone already is answered 410, what the dashboard shows; a store that cannot be
    // read for another reason is an `error` event, and the stream waits for it to change.
    if let Err(error) = state.read(|_| Ok(())).await {
        if error.is_gone() {
            return Err(error);
        }
    }
    let cursor = Cursor {
        changes: state.changes(),
        _open: OpenStream::new(state.clone()),
        state,
        after,
        pending: VecDeque::new(),
        failed: false,
        end_sent: false,
        gone: false,
    };
    let events = stream::unfold(cursor, |mut cursor| async move {
        loop {
            if let Some(event) = cursor.pending.pop_front() {
                return Some((Ok(event), cursor));
            }
            if cursor.gone {
                return None;
            }
            if std::mem::take(&mut cursor.failed) && !cursor.next_change().await {
                std::future::pending::<()>().await;
            }
            // Marked seen before the read: a commit that lands during the read changes it
            // again, so the wait below cannot miss it.
            cursor.changes.borrow_and_update();
            let after = cursor.after;
            match cursor
                .state
                .read(move |reader| reader.events_since(after, BATCH))
                .await
            {
                Ok(records) if !records.is_empty() => {
                    for record in records {
                        cursor.after = record.seq;
                        let data = serde_json::to_string(&record).unwrap_or_default();
                        cursor.pending.push_back(
                            Event::default()
                                .id(record.seq.to_string())
                                .event(record.event.kind())
                                .data(data),
                        );
                    }
                }
                Ok(_) => {
                    if cursor.next_change().await {
                        continue;
                    }
                    // The writer is gone and every event it committed was sent: the process
                    // running the experiment is closing. Said once (a page reads the final
                    // state at once, then closes this stream; see `streams_closed`), then the
                    // response stays open with keep-alives until the client leaves.
                    if !cursor.state.inner.own_writer
                        || std::mem::replace(&mut cursor.end_sent, true)
                    {
                        std::future::pending::<()>().await;
                    }
                    let event = Event::default().event("end").data("{}");
                    return Some((Ok(event), cursor));
                }
                Err(error) => {
                    cursor.failed = true;
                    cursor.gone = error.is_gone();
                    let event = Event::default().event("error").data(error.message);
                    return Some((Ok(event), cursor));
                }
            }
        }
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}
