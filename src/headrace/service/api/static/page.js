// Counts the items that became reviewable after this page was loaded, every few seconds, and
// says so above the list: the list itself never changes until the moderator follows the link.
(function () {
  const boundary = document.getElementById("boundary");
  if (!boundary) return;
  const event = boundary.dataset.event;
  const upto = boundary.dataset.upto;
  async function check() {
    try {
      const answer = await fetch(`/moderate/${event}/new?upto=${upto}`, { credentials: "same-origin" });
      if (!answer.ok) return;
      const found = await answer.json();
      if (found.newer > 0) {
        const link = document.createElement("a");
        link.id = "show-new";
        link.href = `/moderate/${event}?upto=${found.latest}`;
        link.textContent = `Show ${found.newer} new item${found.newer === 1 ? "" : "s"}`;
        boundary.replaceChildren(link);
      }
    } catch (error) {
      // the next check tries again
    }
  }
  setInterval(check, 2000);
})();
