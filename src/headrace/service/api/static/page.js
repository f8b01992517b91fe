// The moderator page's script: review by keyboard, claims, and what changed meanwhile.
//
// The list the server rendered never reorders and nothing is inserted into it: items decided
// (here or by someone else) are marked where they are, and items that became reviewable since
// the page was loaded are only counted in the line above the list ("Show N new items").
// The item in focus is claimed for this moderator (renewed while it stays in focus, given back
// when focus leaves it undecided); items other moderators hold are marked and skipped.
(function () {
  "use strict";

  const boundary = document.getElementById("boundary");
  const review = document.getElementById("review");
  if (!boundary || !review) return;

  const event = review.dataset.event;
  const token = review.dataset.formToken;
  const me = review.dataset.me;
  const admin = review.dataset.admin === "yes";
  const undoWindow = Number(review.dataset.undoWindow);
  const renewEvery = Number(review.dataset.renewEvery) * 1000;
  const skew = Number(review.dataset.now) - Date.now() / 1000; // the store's clock, minus ours
  const upto = Number(boundary.dataset.upto);
  let since = Number(boundary.dataset.since);

  const list = Array.from(document.querySelectorAll("#items > li.item"));
  const byId = new Map(list.map((li) => [li.dataset.mediaId, li]));
  const status = document.getElementById("status");
  const reasons = document.getElementById("reasons");
  const keys = document.getElementById("keys");
  const selectionBar = document.getElementById("selection");
  const selected = new Set();
  const played = new Set();
  const undoable = []; // this page's decisions, newest last: {id, until}
  let current = null; // the li in focus
  let held = null; // the media id whose claim this page holds
  let busy = false; // one action at a time: keys pressed meanwhile wait for none
  let actionsDone = 0; // said on the body as each ends (data-actions): a script driving the page waits on it

  // -- talking to the service

  async function call(path, body) {
    const answer = await fetch(`/moderate/${event}/${path}`, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-Form-Token": token },
      body: JSON.stringify(body || {}),
    });
    let found = null;
    try {
      found = await answer.json();
    } catch (error) {
      found = null;
    }
    return { ok: answer.ok, status: answer.status, body: found, headers: answer.headers };
  }

  // What an error answer says to do: its problem's detail (RFC 9457, application/problem+json).
  function errorMessage(body) {
    return body.detail;
  }

  function say(text) {
    status.textContent = text;
  }

  // -- what an item shows

  function isOpen(li) {
    return li.dataset.state === "reviewable" && !li.dataset.holder;
  }

  function markHolder(li, holder) {
    if (holder && holder !== me) li.dataset.holder = holder;
    else delete li.dataset.holder;
    li.querySelector(".holder").textContent = li.dataset.holder ? `${holder} is on it` : "";
    const release = li.querySelector("button.release");
    if (release) release.hidden = !li.dataset.holder;
  }

  function markState(li, state, by) {
    li.dataset.state = state;
    const shown = state === "reviewable" ? state : `${state}${by ? ` by ${by}` : ""}`;
    li.querySelector(".state").textContent = shown;
    li.classList.toggle("decided", state !== "reviewable");
    if (state !== "reviewable") {
      markHolder(li, null);
      selected.delete(li.dataset.mediaId);
      li.classList.remove("selected");
    }
  }

  function ages() {
    const now = Date.now() / 1000 + skew;
    for (const span of document.querySelectorAll(".age[data-uploaded]")) {
      const seconds = Math.max(0, now - Number(span.dataset.uploaded));
      span.textContent =
        seconds < 60 ? `${Math.round(seconds)} s ago`
        : seconds < 3600 ? `${Math.round(seconds / 60)} min ago`
        : `${Math.round(seconds / 3600)} h ago`;
    }
  }

  // -- focus and claims

  function show(li) {
    if (current) {
      current.classList.remove("current");
      current.removeAttribute("aria-current");
    }
    current = li;
    if (!li) return;
    li.classList.add("current");
    li.setAttribute("aria-current", "true");
    li.focus({ preventScroll: true });
    li.scrollIntoView({ block: "nearest" });
  }

  async function letGo() {
    // Focus leaves an undecided item: its claim goes back for others.
    if (held && byId.get(held) && byId.get(held).dataset.state === "reviewable") {
      const id = held;
      held = null;
      await call(`release/${id}`);
    }
    held = null;
  }

  async function take(li) {
    const answer = await call(`claim/${li.dataset.mediaId}`);
    if (answer.ok) {
      held = li.dataset.mediaId;
      markHolder(li, null);
      return true;
    }
    refused(li, answer);
    return false;
  }

  function refused(li, answer) {
    // A 409 says who holds the item (X-Holder) or the state it is in (X-State).
    if (answer.status !== 409) return;
    const holder = answer.headers.get("X-Holder");
    const state = answer.headers.get("X-State");
    if (holder) markHolder(li, holder);
    else if (state) markState(li, state);
  }

  async function next() {
    // The next item past the one in focus that nobody else holds, claimed by the service.
    await letGo();
    const after = current ? Number(current.dataset.seq) : 0;
    const answer = await call("next", { after: after, upto: upto });
    if (!answer.ok) {
      say("Could not reach the service: try again.");
      return;
    }
    for (const [id, holder] of Object.entries(answer.body.taken)) {
      if (byId.has(id)) markHolder(byId.get(id), holder);
    }
    const li = answer.body.media_id ? byId.get(answer.body.media_id) : null;
    if (answer.body.media_id && !li) {
      // not on this page (it cannot be: the boundary is the last item listed): give it back
      await call(`release/${answer.body.media_id}`);
    }
    if (li) {
      held = li.dataset.mediaId;
      markHolder(li, null);
      show(li);
      say("");
    } else {
      say("Nothing more to review up to here." + (document.getElementById("show-new") ? " n shows the new items." : ""));
      document.getElementById("end").scrollIntoView({ block: "nearest" });
    }
  }

  async function previous() {
    await letGo();
    let at = current ? list.indexOf(current) - 1 : list.length - 1;
    for (; at >= 0; at -= 1) {
      const li = list[at];
      if (!isOpen(li)) continue;
      if (await take(li)) {
        show(li);
        say("");
        return;
      }
    }
    say("Nothing before this one to review.");
  }

  async function renew() {
    if (!held) return;
    const li = byId.get(held);
    if (li && !(await take(li))) {
      held = null;
      say("Someone else has this item now.");
    }
  }

  // -- decisions

  function needsPlaying(li) {
    const media = li.querySelector("audio, video");
    return media && !played.has(li.dataset.mediaId);
  }

  async function decide(decision, reason) {
    if (selected.size) return bulk(decision, reason);
    const li = current;
    if (!li || li.dataset.state !== "reviewable") {
      say("Nothing in focus to decide: j moves to the next item.");
      return;
    }
    if (decision === "approve" && needsPlaying(li)) {
      const media = li.querySelector("audio, video");
      media.play();
      say("Hear or watch it to the end first: it plays now.");
      return;
    }
    const answer = await call(`decide/${li.dataset.mediaId}`, { decision: decision, reason: reason });
    if (!answer.ok) {
      refused(li, answer);
      say(answer.body ? `Not decided: ${errorMessage(answer.body)}.` : "Not decided: try again.");
      await next();
      return;
    }
    held = null;
    markState(li, answer.body.state, me);
    if (answer.body.applied) undoable.push({ id: li.dataset.mediaId, until: Date.now() + undoWindow * 1000 });
    say(`${answer.body.state === "approved" ? "Approved" : "Rejected"}. u undoes it for ${undoWindow} s.`);
    await next();
  }

  async function bulk(decision, reason) {
    const ids = Array.from(selected);
    const answer = await call("bulk", { decision: decision, media_ids: ids, reason: reason });
    if (!answer.ok) {
      say(answer.body ? errorMessage(answer.body) : "The decision was not taken: try again.");
      return;
    }
    let done = 0;
    const conflicts = [];
    for (const result of answer.body) {
      const li = byId.get(result.media_id);
      if (result.applied) {
        done += 1;
        undoable.push({ id: result.media_id, until: Date.now() + undoWindow * 1000 });
      } else if (result.conflict === "claimed") {
        conflicts.push(`${result.holder} is on one`);
      } else if (result.conflict) {
        conflicts.push(`one was ${result.state || result.conflict} already`);
      }
      if (li && result.conflict === "claimed") markHolder(li, result.holder);
      else if (li && result.state) markState(li, result.state, result.applied ? me : null);
    }
    clearSelection();
    held = null;
    say(`${done} ${decision === "approve" ? "approved" : "rejected"}.` + (conflicts.length ? ` Not decided: ${conflicts.join("; ")}.` : ""));
    await next();
  }

  async function undo() {
    while (undoable.length && undoable[undoable.length - 1].until < Date.now()) undoable.pop();
    const last = undoable.pop();
    if (!last) {
      say(`Nothing to undo: a decision can be undone for ${undoWindow} s.`);
      return;
    }
    const answer = await call(`undo/${last.id}`);
    if (!answer.ok) {
      say(answer.body ? `Not undone: ${errorMessage(answer.body)}.` : "Not undone: try again.");
      return;
    }
    await letGo();
    const li = byId.get(last.id);
    markState(li, "reviewable");
    held = last.id;
    show(li);
    say("Undone: it waits for a decision again.");
  }

  // -- selection

  function refreshSelection() {
    selectionBar.hidden = selected.size === 0;
    document.getElementById("selection-count").textContent = `${selected.size} selected`;
  }

  function clearSelection() {
    for (const id of selected) byId.get(id).classList.remove("selected");
    selected.clear();
    anchor = null;
    refreshSelection();
  }

  let anchor = null; // the item x last toggled: X selects from it to the item in focus

  function toggle(li) {
    if (!li || li.dataset.state !== "reviewable") return;
    const id = li.dataset.mediaId;
    if (selected.has(id)) selected.delete(id);
    else selected.add(id);
    li.classList.toggle("selected", selected.has(id));
    anchor = li;
    refreshSelection();
  }

  function selectRange(li) {
    if (!li) return;
    const from = anchor ? list.indexOf(anchor) : list.indexOf(li);
    const to = list.indexOf(li);
    for (let at = Math.min(from, to); at <= Math.max(from, to); at += 1) {
      const other = list[at];
      if (isOpen(other) || other === current) {
        selected.add(other.dataset.mediaId);
        other.classList.add("selected");
      }
    }
    anchor = li;
    refreshSelection();
    say(`${selected.size} selected: a approves, r rejects them all, Esc clears.`);
  }

  function selectSession(li) {
    if (!li) return;
    for (const other of list) {
      if (other.dataset.session === li.dataset.session && isOpen(other)) {
        selected.add(other.dataset.mediaId);
        other.classList.add("selected");
      }
    }
    refreshSelection();
    say(`${selected.size} pending item${selected.size === 1 ? "" : "s"} of ${li.dataset.session} selected: a approves, r rejects them all, Esc clears.`);
  }

  // -- the keys

  function playPause(li) {
    const media = li && li.querySelector("audio, video");
    if (!media) return;
    if (media.paused) media.play();
    else media.pause();
  }

  function pickReason() {
    return new Promise((resolve) => {
      reasons.showModal();
      const codes = Array.from(reasons.querySelectorAll("li[data-reason]")).map((li) => li.dataset.reason);
      function onKey(press) {
        press.preventDefault();
        press.stopPropagation();
        const n = Number(press.key);
        if (press.key === "Escape") finish(null);
        else if (n >= 1 && n <= codes.length) finish(codes[n - 1]);
      }
      function finish(code) {
        document.removeEventListener("keydown", onKey, true);
        reasons.close();
        resolve(code);
      }
      document.addEventListener("keydown", onKey, true);
    });
  }

  const actions = {
    j: next,
    k: previous,
    a: () => decide("approve", null),
    r: async () => {
      const code = await pickReason();
      if (code) await decide("reject", code);
    },
    u: undo,
    " ": async () => playPause(current),
    s: async () => selectSession(current),
    x: async () => toggle(current),
    X: async () => selectRange(current),
    n: async () => {
      const more = document.getElementById("show-new");
      if (more) window.location.assign(more.href);
    },
    "?": async () => keys.showModal(),
    Escape: async () => {
      if (keys.open) keys.close();
      clearSelection();
    },
  };

  document.addEventListener("keydown", async (press) => {
    if (press.ctrlKey || press.metaKey || press.altKey) return;
    const typing = press.target.closest && press.target.closest("input, select, textarea");
    if (typing || reasons.open) return;
    if (keys.open && press.key !== "Escape" && press.key !== "?") return;
    const action = actions[press.key];
    if (!action) return;
    press.preventDefault();
    if (busy) return;
    busy = true;
    try {
      await action();
    } finally {
      busy = false;
      actionsDone += 1;
      document.body.dataset.actions = String(actionsDone);
    }
  });

  // -- the mouse, where it helps: the bulk bar, and an admin's release of a claim

  document.getElementById("bulk-approve").addEventListener("click", () => decide("approve", null));
  document.getElementById("bulk-reject").addEventListener("click", () => actions.r());
  document.getElementById("bulk-clear").addEventListener("click", clearSelection);
  for (const li of list) {
    for (const media of li.querySelectorAll("audio, video")) {
      media.addEventListener("ended", () => played.add(li.dataset.mediaId));
    }
    const release = li.querySelector("button.release");
    if (release && admin) {
      release.addEventListener("click", async () => {
        const why = window.prompt(`Release ${li.dataset.holder}'s claim: why?`);
        if (!why) return;
        const answer = await call(`release/${li.dataset.mediaId}`, { reason: why });
        if (answer.ok) markHolder(li, null);
      });
    }
  }

  // -- what changed meanwhile

  async function check() {
    try {
      const answer = await fetch(`/moderate/${event}/new?upto=${upto}&since=${since}`, { credentials: "same-origin" });
      if (!answer.ok) return;
      const found = await answer.json();
      if (found.newer > 0) {
        const link = document.createElement("a");
        link.id = "show-new";
        link.href = `/moderate/${event}?upto=${found.latest}`;
        link.textContent = `Show ${found.newer} new item${found.newer === 1 ? "" : "s"}`;
        boundary.replaceChildren(link);
      }
      for (const li of list) {
        if (li.dataset.state !== "reviewable") continue;
        const holder = found.claims[li.dataset.mediaId];
        if (li.dataset.mediaId !== held) markHolder(li, holder || null);
      }
      for (const change of found.changed) {
        const li = byId.get(change.media_id);
        if (li && li.dataset.state !== change.state && change.media_id !== held) {
          markState(li, change.state, change.decided_by);
        }
      }
      since = found.since;
    } catch (error) {
      // the next check tries again
    }
  }

  // -- the start: the first item nobody holds is this moderator's

  for (const li of list) if (li.dataset.holder) markHolder(li, li.dataset.holder);
  ages();
  setInterval(ages, 15000);
  setInterval(check, 2000);
  setInterval(renew, renewEvery);
  const signOut = document.querySelector('form[action="/logout"]');
  // Signing out gives every claim back on the server: nothing left for the page to release.
  if (signOut) signOut.addEventListener("submit", () => { held = null; });
  window.addEventListener("pagehide", () => {
    if (held) {
      const body = new Blob([JSON.stringify({})], { type: "application/json" });
      // a claim given back as the page goes (else it lapses by itself)
      fetch(`/moderate/${event}/release/${held}`, {
        method: "POST",
        keepalive: true,
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-Form-Token": token },
        body: body,
      });
    }
  });
  if (list.length) {
    busy = true;
    next().finally(() => {
      busy = false;
      document.body.dataset.ready = "yes";
    });
  } else {
    document.body.dataset.ready = "yes";
  }
})();
