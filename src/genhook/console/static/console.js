// Progressive enhancement of the console: every page works without it.

function liveTask() {
  const live = document.getElementById("live");
  if (!live || live.dataset.terminal === "yes") return;
  const source = new EventSource(`/console/tasks/${encodeURIComponent(live.dataset.task)}/events`);
  const status = document.getElementById("task-status");
  const queue = document.getElementById("task-queue");
  const progress = document.getElementById("task-progress");
  const logs = document.getElementById("task-logs");
  const update = (event) => {
    const task = JSON.parse(event.data);
    status.textContent = task.status;
    status.className = `status-${task.status}`;
    queue.textContent = task.queue_position !== undefined ? `Queue position ${task.queue_position}.` : "";
    if (task.progress !== undefined) progress.value = task.progress;
    for (const line of task.logs || []) {
      const item = document.createElement("li");
      item.textContent = `${line.at} ${line.message}`;
      logs.append(item);
    }
    if (["completed", "failed", "canceled"].includes(task.status)) {
      if (task.status === "completed") progress.value = 1;
      source.close();
      window.location.reload();
    }
  };
  for (const name of ["created", "processing", "completed", "failed", "canceled"]) {
    source.addEventListener(name, update);
  }
}

function preview(input) {
  const list = document.getElementById(input.id.replace(/^f-/, "p-"));
  if (!list) return;
  list.replaceChildren();
  for (const file of input.files) {
    const item = document.createElement("li");
    if (file.type.startsWith("image/")) {
      const img = document.createElement("img");
      img.alt = file.name;
      img.src = URL.createObjectURL(file);
      item.append(img);
    } else {
      item.textContent = file.name;
    }
    list.append(item);
  }
}

function setFiles(input, files) {
  const transfer = new DataTransfer();
  if (input.multiple) for (const file of input.files) transfer.items.add(file);
  for (const file of files) {
    transfer.items.add(file);
    if (!input.multiple) break;
  }
  input.files = transfer.files;
  preview(input);
}

function dropZones() {
  for (const zone of document.querySelectorAll("[data-drop]")) {
    const input = document.getElementById(zone.dataset.drop);
    input.addEventListener("change", () => preview(input));
    zone.addEventListener("dragover", (event) => { event.preventDefault(); zone.classList.add("over"); });
    zone.addEventListener("dragleave", () => zone.classList.remove("over"));
    zone.addEventListener("drop", (event) => {
      event.preventDefault();
      zone.classList.remove("over");
      setFiles(input, event.dataTransfer.files);
    });
  }
  const first = document.querySelector("[data-drop]");
  if (first) {
    document.addEventListener("paste", (event) => {
      const files = [...(event.clipboardData?.files || [])];
      if (files.length) setFiles(document.getElementById(first.dataset.drop), files);
    });
  }
}

function sliders() {
  for (const range of document.querySelectorAll("input[type=range][data-output]")) {
    const out = document.getElementById(range.dataset.output);
    range.addEventListener("input", () => { out.textContent = range.value; });
  }
}

// "Show the request" asks the server for the snippets without leaving the page, so the
// files already chosen stay chosen (a page load would empty every file input).
function previewInPlace() {
  const form = document.getElementById("play-form");
  const place = document.getElementById("request");
  if (!form || !place) return;
  form.addEventListener("submit", async (event) => {
    if (event.submitter?.value !== "preview") return;
    event.preventDefault();
    // getAttribute: `form.action` is the button named "action", not the form's URL.
    const url = form.getAttribute("action");
    const response = await fetch(url, { method: "POST", body: new FormData(form, event.submitter) });
    const page = new DOMParser().parseFromString(await response.text(), "text/html");
    const shown = page.getElementById("request");
    if (!shown) return;
    place.replaceChildren(...shown.childNodes);
    place.hidden = false;
    copyButtons(place);
    place.scrollIntoView();
  });
}

function copyButtons(root = document) {
  for (const button of root.querySelectorAll("[data-copy]")) {
    button.addEventListener("click", async () => {
      const text = document.getElementById(button.dataset.copy).textContent;
      try {
        await navigator.clipboard.writeText(text);
        button.textContent = "Copied";
      } catch {
        button.textContent = "Select the text to copy";
      }
    });
  }
}

function transcript() {
  const words = document.querySelectorAll("#transcript span[data-start]");
  const player = document.querySelector("audio");
  if (!words.length || !player) return;
  player.addEventListener("timeupdate", () => {
    const t = player.currentTime;
    for (const word of words) {
      word.classList.toggle("now", t >= Number(word.dataset.start) && t < Number(word.dataset.end));
    }
  });
}

// The person's own uploads, kept in this tab only, so a finished task can show its outputs
// beside them (the service deletes inputs when a task ends) and play the audio it transcribed.
const PENDING = "genhook-console-pending-inputs";

function readAsDataURL(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

function rememberInputs() {
  const form = document.getElementById("play-form");
  if (!form) return;
  form.addEventListener("submit", async (event) => {
    if (form.dataset.remembered === "yes" || event.submitter?.value === "preview") return;
    const files = [...form.querySelectorAll("input[type=file]")].flatMap((input) => [...input.files]);
    if (!files.length) return;
    event.preventDefault();
    try {
      const items = [];
      for (const file of files) items.push({ name: file.name, type: file.type, url: await readAsDataURL(file) });
      sessionStorage.setItem(PENDING, JSON.stringify({ model: form.dataset.model, items }));
    } catch {
      sessionStorage.removeItem(PENDING);
    }
    form.dataset.remembered = "yes";
    form.requestSubmit(event.submitter);
  });
}

function showInputs() {
  const live = document.getElementById("live");
  const place = document.getElementById("inputs");
  if (!live || !place) return;
  const key = `genhook-console-inputs:${live.dataset.task}`;
  let saved = sessionStorage.getItem(key);
  const pending = sessionStorage.getItem(PENDING);
  if (!saved && pending && JSON.parse(pending).model === live.dataset.model) {
    saved = pending;
    try { sessionStorage.setItem(key, pending); } catch { /* full: show it this once */ }
    sessionStorage.removeItem(PENDING);
  }
  if (!saved) return;
  for (const item of JSON.parse(saved).items) {
    const figure = document.createElement("figure");
    let media;
    if (item.type.startsWith("image/")) {
      media = document.createElement("img");
      media.alt = `Input ${item.name}`;
    } else if (item.type.startsWith("audio/")) {
      media = document.createElement("audio");
      media.controls = true;
    } else continue;
    media.className = "input";
    media.src = item.url;
    const caption = document.createElement("figcaption");
    caption.textContent = `Input: ${item.name}`;
    figure.append(media, caption);
    place.append(figure);
  }
  place.hidden = false;
}

document.documentElement.dataset.enhanced = "yes";
rememberInputs();
showInputs();
liveTask();
dropZones();
sliders();
previewInPlace();
copyButtons();
transcript();
