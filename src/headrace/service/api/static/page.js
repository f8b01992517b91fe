// The moderator page's script: review by keyboard and mouse alike, claims, and what changed
// meanwhile.
//
// One item is the current one (outlined, aria-current), and one function moves it, whatever
// moved it: a click anywhere on a card or its buttons, j and k, focus arriving by Tab, the page
// scrolled until the current item is out of view (the first open item in view takes its place),
// the current item decided (here or elsewhere: the next one nobody holds), an undo (the undone
// item), an item freed while there is no current one. The claim this page holds follows the
// current item. A key acts on the current item (on the selection, when there is one); a card's
// own button acts on that card; the selection bar's buttons on the selection.
//
// The list the server rendered never reorders and nothing is inserted into it: items decided
// (here or by someone else) are marked where they are, and items that became reviewable since
// the page was loaded are only counted in the line above the list ("Show N new items").
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
  const topbar = document.getElementById("topbar");
  const status = document.getElementById("status");
  const reasons = document.getElementById("reasons");
  const preview = document.getElementById("preview");
  const keys = document.getElementById("keys");
  const selectionBar = document.getElementById("selection");
  const selected = new Set();
  const played = new Set(); // media ids whose sound or video played to its end here
  const pending = new Map(); // session label -> its items waiting for a decision
  const undoable = []; // this page's decisions, newest last: {id, until}
  const reopened = new Set(); // media ids decided, then reviewable again since the page was loaded
  const NOUNS = { image: "photo", audio: "recording", video: "video" };
  let current = null; // the current item's li
  let pageScrollY = null; // where the page last scrolled to itself, showing an item
  let settling = null; // the timer that looks at the page once the moderator's scrolling stops
  let moves = 0; // times the current item moved: an answer that comes late does not move it back
  let held = null; // the media id whose claim this page holds
  let lane = Promise.resolve(); // claims are taken and given back one at a time, in order
  let busy = false; // one action at a time: a key or click meanwhile is ignored
  let anchor = null; // the item x last toggled: X selects from it to the current item
  let actionsDone = 0; // said on the body as each ends (data-actions): a script driving the page waits on it
  let checks = 0; // and the checks of what changed meanwhile (data-checks)

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

  // What an error answer says (an RFC 9457 problem): the one place that knows its shape.
  function errorText(body) {
    if (!body || typeof body !== "object") return null;
    if (typeof body.detail === "string") return body.detail;
    return typeof body.title === "string" ? body.title : null;
  }

  // The status line says what the last action did; it stays until the next action.
  function say(text) {
    status.textContent = text;
  }

  function tell(text) {
    say(status.textContent ? `${status.textContent} ${text}` : text);
  }

  function named(li) {
    return `the ${NOUNS[li.dataset.type] || "item"} from ${li.dataset.session}`;
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
    const was = li.dataset.state;
    li.dataset.state = state;
    const shown = state === "reviewable" ? state : `${state}${by ? ` by ${by}` : ""}`;
    li.querySelector(".state").textContent = shown;
    li.classList.toggle("decided", state !== "reviewable");
    if (state !== "reviewable") {
      markHolder(li, null);
      setSelected(li, false);
      refreshSelection();
      li.classList.remove("unplayed");
    }
    if ((was === "reviewable") !== (state === "reviewable")) {
      countPending(li.dataset.session, state === "reviewable" ? 1 : -1);
      if (state === "reviewable") reopened.add(li.dataset.mediaId);
      else reopened.delete(li.dataset.mediaId);
    }
    showUndo(li);
  }

  function countPending(session, change) {
    const now = Math.max(0, (pending.get(session) || 0) + change);
    pending.set(session, now);
    for (const li of list) {
      if (li.dataset.session === session) li.querySelector(".pending").textContent = `${now} pending`;
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

  // -- the current item, and the claim that follows it

  function setCurrent(li, how) {
    if (li !== current) {
      moves += 1;
      if (current) {
        current.classList.remove("current");
        current.removeAttribute("aria-current");
      }
      current = li;
      if (li) {
        li.classList.add("current");
        li.setAttribute("aria-current", "true");
      }
      document.body.dataset.current = li ? li.dataset.mediaId : "";
    }
    if (li && how && how.focus && !li.contains(document.activeElement)) li.focus({ preventScroll: true });
    if (li && how && how.scroll) show(li);
    return followClaim();
  }

  function show(element) {
    element.scrollIntoView({ block: "nearest" });
    pageScrollY = window.scrollY; // where the page scrolled itself: no reason to move the current item
  }

  function hold(id) {
    held = id;
    document.body.dataset.held = id || ""; // for a script driving the page
  }

  function inLane(work) {
    const run = lane.then(work);
    lane = run.catch(() => undefined);
    return run;
  }

  function followClaim() {
    return inLane(async () => {
      const li = current && current.dataset.state === "reviewable" ? current : null;
      const wanted = li ? li.dataset.mediaId : null;
      if (held && held !== wanted) await letGo();
      if (li && held !== wanted && !li.dataset.holder) await take(li);
    });
  }

  async function letGo() {
    // The claim goes back for others, unless its item was decided (then it is gone already).
    const li = held ? byId.get(held) : null;
    hold(null);
    if (li && li.dataset.state === "reviewable") await call(`release/${li.dataset.mediaId}`);
  }

  async function take(li) {
    const answer = await call(`claim/${li.dataset.mediaId}`);
    if (answer.ok) {
      hold(li.dataset.mediaId);
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

  async function renew() {
    await inLane(async () => {
      const li = held ? byId.get(held) : null;
      if (!li) return;
      if (li.dataset.state !== "reviewable") hold(null);
      else if (!(await take(li))) {
        hold(null);
        say(`Someone else has ${named(li)} now.`);
      }
    });
  }

  async function next() {
    // The next item past the current one that nobody else holds, claimed by the service.
    const after = current ? Number(current.dataset.seq) : 0;
    const mark = moves;
    const answer = await inLane(async () => {
      await letGo();
      const found = await call("next", { after: after, upto: upto });
      const id = found.ok ? found.body.media_id : null;
      if (id && byId.has(id)) hold(id);
      else if (id) await call(`release/${id}`); // not on this page (the boundary keeps it off): given back
      return found;
    });
    if (!answer.ok) {
      say("Could not reach the service: try again.");
      return;
    }
    for (const [id, holder] of Object.entries(answer.body.taken)) {
      if (byId.has(id)) markHolder(byId.get(id), holder);
    }
    if (moves !== mark) return followClaim(); // the moderator moved meanwhile: theirs stands
    const li = answer.body.media_id ? byId.get(answer.body.media_id) : null;
    if (li) {
      markHolder(li, null);
      await setCurrent(li, { focus: true, scroll: true });
      return;
    }
    if (await takeReopened()) return;
    await setCurrent(null);
    tell("Nothing more to review up to here." + (document.getElementById("show-new") ? " n shows the new items." : ""));
    show(document.getElementById("end"));
  }

  async function takeReopened() {
    // An item reopened since the page was loaded (an undo) moved past the boundary, where the
    // service's `next` does not look: the page knows it. Whether one became current, and ours.
    for (const other of list.slice(list.indexOf(current) + 1)) {
      if (!isOpen(other) || !reopened.has(other.dataset.mediaId)) continue;
      await setCurrent(other, { focus: true, scroll: true });
      if (held === other.dataset.mediaId) return true;
    }
    return false;
  }

  async function previous() {
    const from = current ? list.indexOf(current) : list.length;
    for (let at = from - 1; at >= 0; at -= 1) {
      const li = list[at];
      if (!isOpen(li)) continue;
      await setCurrent(li, { focus: true, scroll: true });
      if (held === li.dataset.mediaId) return;
    }
    say("Nothing before this one to review.");
  }

  // -- the page scrolled: the current item stays one the moderator can see

  function inView(li) {
    // The share of `li` in view below the sticky bar (of the part that could fit in view).
    const box = li.getBoundingClientRect();
    const top = topbar.getBoundingClientRect().bottom;
    const shown = Math.min(box.bottom, window.innerHeight) - Math.max(box.top, top);
    return Math.max(0, shown) / Math.max(1, Math.min(box.height, window.innerHeight - top));
  }

  function afterScroll() {
    if (document.querySelector("dialog[open]")) return;
    if (busy) {
      settling = setTimeout(afterScroll, 150); // once the action in hand is done
      return;
    }
    if (current && inView(current) >= 0.5) return;
    const open = list.filter((li) => isOpen(li) && inView(li) > 0);
    if (!open.length) return;
    const best = open.find((li) => inView(li) >= 0.5) || open.reduce((a, b) => (inView(b) > inView(a) ? b : a));
    setCurrent(best, { focus: true });
  }

  // -- decisions

  function rememberUndo(id) {
    undoable.push({ id: id, until: Date.now() + undoWindow * 1000 });
  }

  function undoEntry(id) {
    for (let at = undoable.length - 1; at >= 0; at -= 1) {
      const entry = undoable[at];
      if (entry.until > Date.now() && (id === null || entry.id === id)) return entry;
    }
    return null;
  }

  function showUndo(li) {
    const button = li.querySelector("button.undo");
    const entry = li.dataset.state !== "reviewable" ? undoEntry(li.dataset.mediaId) : null;
    button.hidden = !entry;
    if (entry) setTimeout(() => showUndo(li), entry.until - Date.now() + 50);
  }

  function media(li) {
    return li ? li.querySelector("audio, video") : null;
  }

  // The one rule for approving sound or video, whatever asks (a card's Approve, the a key, the
  // selection): played to the end here first. Returns the items of `items` that may be
  // approved; the others are marked ("play it to the end first"), and a single one that may
  // not starts playing.
  function playedFirst(items) {
    const waiting = items.filter((li) => media(li) && !played.has(li.dataset.mediaId));
    for (const li of list) li.classList.toggle("unplayed", waiting.includes(li));
    if (items.length === 1 && waiting.length === 1) startPlaying(waiting[0]);
    return items.filter((li) => !waiting.includes(li));
  }

  function notPlayed(n) {
    // What the selection's approval says of the `n` items it left for later.
    const them = n === 1 ? "it" : "them";
    return `Not approved: ${n} not played to the end yet (still selected, marked "play it to the end first"): play ${them}, or Esc.`;
  }

  async function decide(li, decision, reason) {
    if (!li || li.dataset.state !== "reviewable") {
      say("Nothing to decide here: j moves to the next item.");
      return;
    }
    if (decision === "approve" && !playedFirst([li]).length) {
      say(`Not approved: hear or watch ${named(li)} to the end first. It plays now.`);
      return;
    }
    const id = li.dataset.mediaId;
    // In the claims' lane: a claim of this item asked for a moment ago is answered first.
    const answer = await inLane(async () => {
      const decided = await call(`decide/${id}`, { decision: decision, reason: reason });
      if (decided.ok && held === id) hold(null); // a decided item's claim is gone
      return decided;
    });
    if (!answer.ok) {
      refused(li, answer);
      say(`Not decided: ${errorText(answer.body) || "try again"}.`);
      if (answer.status === 409 && li === current) await next();
      return;
    }
    if (answer.body.applied) rememberUndo(id);
    markState(li, answer.body.state, me);
    const done = answer.body.state === "approved" ? "Approved" : "Rejected";
    say(`${done}: ${named(li)}. u (or its Undo button) undoes it for ${undoWindow} s.`);
    if (li === current) await next();
  }

  async function reject(li) {
    if (!li || li.dataset.state !== "reviewable") {
      say("Nothing to reject here: j moves to the next item.");
      return;
    }
    const code = await pickReason(named(li));
    if (code) await decide(li, "reject", code);
    else say("Nothing rejected.");
  }

  async function decideSelected(decision) {
    // An approval takes the items played to the end (and the photos); the others stay selected.
    const chosen = Array.from(selected, (id) => byId.get(id));
    const items = decision === "approve" ? playedFirst(chosen) : chosen;
    const left = chosen.length - items.length;
    if (!items.length) {
      say(notPlayed(left).replace("Not approved:", "Nothing approved:"));
      return;
    }
    let reason = null;
    if (decision === "reject") {
      reason = await pickReason(`the ${items.length} selected item${items.length === 1 ? "" : "s"}`);
      if (!reason) {
        say("Nothing rejected.");
        return;
      }
    }
    const ids = items.map((li) => li.dataset.mediaId);
    const answer = await inLane(() => call("bulk", { decision: decision, media_ids: ids, reason: reason }));
    if (!answer.ok) {
      say(`Not decided: ${errorText(answer.body) || "try again"}.`);
      return;
    }
    const done = bulkResults(answer.body);
    for (const li of items) setSelected(li, false);
    if (!selected.size) anchor = null;
    refreshSelection();
    const conflicts = done.conflicts.length ? ` Not decided: ${done.conflicts.join("; ")}.` : "";
    say(`${done.count} ${decision === "approve" ? "approved" : "rejected"}.${conflicts}${left ? ` ${notPlayed(left)}` : ""}`);
    if (held && byId.get(held).dataset.state !== "reviewable") hold(null); // decided: its claim is gone
    if (current && current.dataset.state !== "reviewable") await next();
  }

  function bulkResults(results) {
    let count = 0;
    const conflicts = [];
    for (const result of results) {
      const li = byId.get(result.media_id);
      if (result.applied) {
        count += 1;
        rememberUndo(result.media_id);
      } else if (result.conflict === "claimed") {
        conflicts.push(`${result.holder} is on one`);
      } else if (result.conflict) {
        conflicts.push(`one was ${result.state || result.conflict} already`);
      }
      if (li && result.conflict === "claimed") markHolder(li, result.holder);
      else if (li && result.state) markState(li, result.state, result.applied ? me : null);
    }
    return { count: count, conflicts: conflicts };
  }

  async function undo(id) {
    // `id`: the decision a card's Undo button names; null (the u key): this page's last one.
    const entry = undoEntry(id);
    if (!entry) {
      say(`Nothing to undo: a decision can be undone for ${undoWindow} s.`);
      return;
    }
    undoable.splice(undoable.indexOf(entry), 1);
    const li = byId.get(entry.id);
    const answer = await inLane(async () => {
      const undone = await call(`undo/${entry.id}`);
      if (!undone.ok) return undone;
      if (held && held !== entry.id) await letGo();
      hold(entry.id); // an undone item is back in the hands of who undid it
      return undone;
    });
    if (!answer.ok) {
      showUndo(li);
      say(`Not undone: ${errorText(answer.body) || "try again"}.`);
      return;
    }
    markState(li, "reviewable");
    await setCurrent(li, { focus: true, scroll: true });
    say(`Undone: ${named(li)} waits for a decision again.`);
  }

  // -- the reasons of a rejection, and the photo large

  function pickReason(what) {
    // Resolves to the reason's code, or null: closed with Esc or its Close button.
    return new Promise((resolve) => {
      document.getElementById("reasons-for").textContent = `${what[0].toUpperCase()}${what.slice(1)}: nothing is filed until you pick a reason.`;
      reasons.returnValue = "";
      reasons.addEventListener("close", () => resolve(reasons.returnValue || null), { once: true });
      reasons.showModal();
      reasons.focus(); // the dialog itself, so that Enter files nothing
    });
  }

  function reasonKey(press) {
    const codes = Array.from(reasons.querySelectorAll("button.reason"), (button) => button.value);
    const n = Number(press.key);
    if (Number.isInteger(n) && n >= 1 && n <= codes.length) {
      press.preventDefault();
      reasons.close(codes[n - 1]);
    }
  }

  function openPreview(li) {
    const link = li ? li.querySelector("a.whole") : null;
    if (!link) {
      say("Only a photo opens large: space plays sound and video.");
      return;
    }
    const image = document.getElementById("preview-image");
    image.src = link.href;
    image.alt = `${named(li)}, whole`;
    document.getElementById("preview-title").textContent = `The photo from ${li.dataset.session}`;
    preview.addEventListener("close", () => li.focus({ preventScroll: true }), { once: true });
    preview.showModal();
    preview.querySelector("button.close").focus();
  }

  // -- sound and video

  function startPlaying(li) {
    const player = media(li);
    if (player) player.play().catch(() => say(`${named(li)} does not play: try its own controls.`));
  }

  function playPause(li) {
    const player = media(li);
    if (!player) say("Nothing to play here: only sound and video play.");
    else if (player.paused) startPlaying(li);
    else player.pause();
  }

  // -- the selection

  function setSelected(li, on) {
    const id = li.dataset.mediaId;
    if (on && li.dataset.state === "reviewable") selected.add(id);
    else selected.delete(id);
    li.classList.toggle("selected", selected.has(id));
    li.querySelector("input.pick").checked = selected.has(id);
  }

  function refreshSelection() {
    selectionBar.hidden = selected.size === 0;
    const sessions = new Set(Array.from(selected, (id) => byId.get(id).dataset.session));
    const whose = sessions.size === 1 ? ` of ${Array.from(sessions)[0]}` : "";
    const n = selected.size;
    document.getElementById("selection-count").textContent = n
      ? `${n} pending item${n === 1 ? "" : "s"}${whose} selected: a approves, r rejects ${n === 1 ? "it" : "them all"}, Esc clears.`
      : "";
  }

  function clearSelection() {
    for (const id of Array.from(selected)) setSelected(byId.get(id), false);
    anchor = null;
    for (const li of list) li.classList.remove("unplayed");
    refreshSelection();
  }

  function toggle(li) {
    if (!li || li.dataset.state !== "reviewable") return;
    setSelected(li, !selected.has(li.dataset.mediaId));
    anchor = li;
    refreshSelection();
  }

  function selectRange(li) {
    if (!li) return;
    const from = anchor ? list.indexOf(anchor) : list.indexOf(li);
    const to = list.indexOf(li);
    for (let at = Math.min(from, to); at <= Math.max(from, to); at += 1) {
      if (isOpen(list[at]) || list[at] === current) setSelected(list[at], true);
    }
    anchor = li;
    refreshSelection();
  }

  function selectSession(li) {
    if (!li) return;
    for (const other of list) {
      if (other.dataset.session === li.dataset.session && (isOpen(other) || other === current)) setSelected(other, true);
    }
    refreshSelection();
  }

  // -- what starts an action: keys, and the mouse

  async function run(action) {
    try {
      if (busy) return;
      busy = true;
      say("");
      try {
        await action();
      } finally {
        busy = false;
      }
    } finally {
      actionsDone += 1;
      document.body.dataset.actions = String(actionsDone);
    }
  }

  const actions = {
    j: next,
    k: previous,
    a: () => (selected.size ? decideSelected("approve") : decide(current, "approve", null)),
    r: () => (selected.size ? decideSelected("reject") : reject(current)),
    u: () => undo(null),
    " ": async () => playPause(current),
    Enter: async () => openPreview(current),
    s: async () => selectSession(current),
    x: async () => toggle(current),
    X: async () => selectRange(current),
    n: async () => {
      const more = document.getElementById("show-new");
      if (more) window.location.assign(more.href);
    },
    "?": async () => keys.showModal(),
    Escape: async () => clearSelection(),
  };

  document.addEventListener("keydown", (press) => {
    if (press.ctrlKey || press.metaKey || press.altKey) return;
    if (document.querySelector("dialog[open]")) return; // a dialog's keys are its own
    const inside = (selector) => press.target.closest && press.target.closest(selector);
    if (inside("input:not([type=checkbox]), select, textarea")) return;
    if ((press.key === " " || press.key === "Enter") && inside("button, a, input, audio, video")) return;
    const action = actions[press.key];
    if (!action) return;
    press.preventDefault();
    run(action);
  });

  function onClick(element, action) {
    if (!element) return;
    element.addEventListener("click", (click) => {
      click.preventDefault();
      run(action);
    });
  }

  function wire(li) {
    li.addEventListener("pointerdown", () => {
      if (li !== current) setCurrent(li);
    });
    for (const form of li.querySelectorAll("form")) form.addEventListener("submit", (sent) => sent.preventDefault());
    onClick(li.querySelector("button.approve"), () => decide(li, "approve", null));
    onClick(li.querySelector("button.reject"), () => reject(li));
    onClick(li.querySelector("button.undo"), () => undo(li.dataset.mediaId));
    onClick(li.querySelector("button.play"), async () => playPause(li));
    onClick(li.querySelector("a.whole"), async () => openPreview(li));
    const pick = li.querySelector("input.pick");
    pick.addEventListener("change", () => {
      toggle(li);
      pick.checked = selected.has(li.dataset.mediaId);
    });
    const player = media(li);
    if (player) wirePlayer(li, player);
    const release = li.querySelector("button.release");
    if (release && admin) onClick(release, () => releaseFor(li));
  }

  function wirePlayer(li, player) {
    const button = li.querySelector("button.play");
    player.addEventListener("play", () => (button.textContent = "Pause"));
    player.addEventListener("pause", () => (button.textContent = "Play"));
    player.addEventListener("ended", () => {
      played.add(li.dataset.mediaId);
      li.classList.remove("unplayed");
      button.textContent = "Play again";
    });
  }

  async function releaseFor(li) {
    // An admin gives another moderator's claim back, saying why.
    const why = window.prompt(`Release ${li.dataset.holder}'s claim: why?`);
    if (!why) return;
    const answer = await call(`release/${li.dataset.mediaId}`, { reason: why });
    if (answer.ok && answer.body.released) {
      markHolder(li, null);
      say(`Released: ${named(li)} is free.`);
    } else say(`Not released: ${errorText(answer.body) || "it was free already"}.`);
  }

  document.addEventListener("focusin", (moved) => {
    const li = moved.target.closest && moved.target.closest("#items > li.item");
    if (li && li !== current) setCurrent(li);
  });
  reasons.addEventListener("keydown", reasonKey);
  document.getElementById("bulk-approve").addEventListener("click", () => run(() => decideSelected("approve")));
  document.getElementById("bulk-reject").addEventListener("click", () => run(() => decideSelected("reject")));
  document.getElementById("bulk-clear").addEventListener("click", () => run(async () => clearSelection()));
  window.addEventListener("scroll", () => {
    if (window.scrollY === pageScrollY) return; // the page's own scroll, not the moderator's
    clearTimeout(settling);
    settling = setTimeout(afterScroll, 150);
  }, { passive: true });

  // -- what changed meanwhile

  function showNew(found) {
    // An item undone since the page was loaded moved past the boundary, but it is on the page.
    const fresh = found.newer_ids ? found.newer_ids.filter((id) => !byId.has(id)).length : found.newer;
    if (fresh > 0) {
      const link = document.createElement("a");
      link.id = "show-new";
      link.href = `/moderate/${event}?upto=${found.latest}`;
      link.textContent = `Show ${fresh} new item${fresh === 1 ? "" : "s"}`;
      boundary.replaceChildren(link);
    } else if (document.getElementById("show-new")) {
      const none = document.createElement("span");
      none.id = "no-new";
      none.textContent = "No new items since this page was loaded.";
      boundary.replaceChildren(none);
    }
  }

  function applyChanges(found) {
    // Who holds what, and what was decided or reopened meanwhile; whether an item opened.
    let opened = false;
    for (const li of list) {
      if (li.dataset.state !== "reviewable" || li.dataset.mediaId === held) continue;
      const had = li.dataset.holder;
      markHolder(li, found.claims[li.dataset.mediaId] || null);
      opened = opened || (had && !li.dataset.holder);
    }
    for (const change of found.changed) {
      const li = byId.get(change.media_id);
      if (li && li.dataset.state !== change.state) {
        markState(li, change.state, change.decided_by);
        opened = opened || change.state === "reviewable";
      }
    }
    return opened;
  }

  async function check() {
    const mark = actionsDone;
    let found = null;
    try {
      const answer = await fetch(`/moderate/${event}/new?upto=${upto}&since=${since}`, { credentials: "same-origin" });
      if (!answer.ok) return;
      found = await answer.json();
    } catch (error) {
      return; // the next check tries again
    }
    showNew(found);
    // What an action of this page changed meanwhile, this answer may not have seen: ask again.
    if (busy || actionsDone !== mark) return;
    const opened = applyChanges(found);
    since = found.since;
    checks += 1;
    document.body.dataset.checks = String(checks);
    const gone = current && current.dataset.state !== "reviewable"; // decided elsewhere
    if (!(gone || (!current && opened))) return;
    busy = true; // the current item left, or one arrived while there was none: the next is current
    try {
      await next();
    } finally {
      busy = false;
    }
  }

  // -- the start: the first item nobody holds is this moderator's

  for (const li of list) {
    markHolder(li, li.dataset.holder || null);
    if (!pending.has(li.dataset.session)) pending.set(li.dataset.session, Number(li.dataset.pending));
    for (const hidden of li.querySelectorAll("label.pick, button.play")) hidden.hidden = false;
    li.querySelector("label.reason").hidden = true; // the dialog asks for the reason
    wire(li);
  }
  const fit = () => document.documentElement.style.setProperty("--topbar", `${topbar.offsetHeight + 8}px`);
  new ResizeObserver(fit).observe(topbar);
  fit();
  ages();
  setInterval(ages, 15000);
  setInterval(check, 2000);
  setInterval(renew, renewEvery);
  const signOut = document.querySelector('form[action="/logout"]');
  // Signing out gives every claim back on the server: nothing left for the page to release.
  if (signOut) signOut.addEventListener("submit", () => hold(null));
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
