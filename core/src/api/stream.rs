//! `GET /stream`: the event log as Server-Sent Events, from a sequence number on, so a client
//! that reconnects (`Last-Event-ID`) or starts from a snapshot never re-downloads everything.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::{self, Stream};

use super::reads::{number_param, params, QueryParams};
use super::{ApiError, ApiState};

/// How often an idle stream looks at the store for new events. The store has no change
/// notification that crosses processes (`knob view` reads another process's store), and one
/// indexed query per client per tick is cheap.
const POLL_INTERVAL: Duration = Duration::from_millis(250);
const BATCH: u64 = 1_000;

struct Cursor {
    state: ApiState,
    after: u64,
    pending: VecDeque<Event>,
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
    let cursor = Cursor {
        state,
        after,
        pending: VecDeque::new(),
    };
    let events = stream::unfold(cursor, |mut cursor| async move {
        loop {
            if let Some(event) = cursor.pending.pop_front() {
                return Some((Ok(event), cursor));
            }
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
                Ok(_) => tokio::time::sleep(POLL_INTERVAL).await,
                Err(error) => {
                    tokio::time::sleep(POLL_INTERVAL * 4).await;
                    return Some((
                        Ok(Event::default().event("error").data(error.message)),
                        cursor,
                    ));
                }
            }
        }
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}
