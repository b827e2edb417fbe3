// The search UI: plain JavaScript, no build step. Talks only to the /v1 REST API.
"use strict";

const $ = (selector) => document.querySelector(selector);
const state = { imageFile: null, classifyFile: null, lastSearch: null };

// ---------------------------------------------------------------- API
class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function authHeaders() {
  const key = localStorage.getItem("cnclip-api-key");
  return key ? { "X-API-Key": key } : {};
}

async function api(path, options = {}) {
  const headers = { ...authHeaders(), ...(options.headers || {}) };
  let response;
  try {
    response = await fetch(path, { ...options, headers });
  } catch (err) {
    throw new ApiError(0, "network", "无法连接服务器，请检查网络或服务是否在运行。");
  }
  if (response.status === 204) return null;
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const error = body && body.error ? body.error : { code: "http_error", message: `HTTP ${response.status}` };
    throw new ApiError(response.status, error.code, error.message);
  }
  return body;
}

const postJson = (path, data) =>
  api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(data) });

// ---------------------------------------------------------------- states
const ERROR_HINTS = {
  unauthorized: "需要 API 密钥：点击右上角「API 密钥」填写。",
  overloaded: "服务繁忙，请稍后重试。",
  payload_too_large: "图片太大。",
  invalid_image: "无法识别这张图片。",
  not_found: "没有找到。",
  encoder_unavailable: "模型正在加载，请稍后重试。",
};

function showStatus(text) {
  const status = $("#status");
  status.innerHTML = "";
  if (text) {
    const spinner = document.createElement("span");
    spinner.className = "spinner";
    status.append(spinner, document.createTextNode(text));
  }
  status.hidden = !text;
}

function showError(err) {
  const box = $("#error");
  if (!err) {
    box.hidden = true;
    box.textContent = "";
    return;
  }
  const hint = ERROR_HINTS[err.code] || "出错了。";
  box.textContent = `${hint}（${err.message}）`;
  box.hidden = false;
}

async function withStatus(text, task) {
  showError(null);
  showStatus(text);
  try {
    return await task();
  } catch (err) {
    showError(err instanceof ApiError ? err : new ApiError(0, "client", String(err)));
    return undefined;
  } finally {
    showStatus("");
  }
}

// ---------------------------------------------------------------- results
function formatTimings(timings) {
  if (!timings) return "";
  const names = { read: "读取", encode: "编码", search: "检索", db: "数据库", total: "总计" };
  return Object.entries(timings)
    .map(([stage, ms]) => `${names[stage] || stage} ${ms.toFixed(1)} ms`)
    .join(" · ");
}

function renderResults(response, title) {
  // Remember the last search so "back" from an item page shows it again.
  if (!location.hash.startsWith("#/item/")) state.lastSearch = [response, title];
  const list = $("#results");
  list.innerHTML = "";
  const heading = $("#results-title");
  heading.hidden = false;
  if (!response.results.length) {
    heading.textContent = "";
    const empty = document.createElement("li");
    empty.className = "empty";
    empty.textContent = "没有找到结果。换个说法试试，或选择其他集合。";
    list.append(empty);
    return;
  }
  heading.textContent = `${title}：${response.results.length} 条结果（集合 ${response.collection}） — ${formatTimings(response.timings)}`;
  for (const result of response.results) list.append(resultCard(result));
}

function resultCard(result) {
  const li = document.createElement("li");
  li.className = result.thumbnail_url ? "card" : "card text-card";
  li.dataset.id = result.id;
  const link = document.createElement("a");
  link.href = result.thumbnail_url ? `#/item/${result.id}` : "#";
  if (result.thumbnail_url) {
    const img = document.createElement("img");
    img.loading = "lazy";
    img.decoding = "async";
    img.src = result.thumbnail_url;
    img.alt = result.caption || `图片 ${result.id}`;
    if (result.width && result.height) {
      img.width = result.width;
      img.height = result.height;
    }
    link.append(img);
  } else {
    link.addEventListener("click", (e) => e.preventDefault());
  }
  const caption = document.createElement("span");
  caption.className = "caption";
  caption.textContent = result.caption || "（无描述）";
  const score = document.createElement("span");
  score.className = "score";
  score.textContent = `相似度 ${result.score.toFixed(3)}`;
  link.append(caption, score);
  li.append(link);
  return li;
}

// ---------------------------------------------------------------- collections
async function loadCollections() {
  const collections = await withStatus("正在加载集合…", () => api("/v1/collections"));
  if (!collections) return;
  fillSelect($("#collection"), collections.filter((c) => c.kind === "images"), "还没有图片集合");
  fillSelect($("#text-collection"), collections.filter((c) => c.kind === "texts"), "还没有文字集合");
}

function fillSelect(select, collections, emptyText) {
  select.innerHTML = "";
  if (!collections.length) {
    select.append(new Option(emptyText, ""));
    return;
  }
  for (const c of collections) {
    const option = new Option(`${c.name}（${c.items}）`, c.name);
    option.selected = c.default;
    select.append(option);
  }
}

const chosen = (select) => select.value || undefined;

// ---------------------------------------------------------------- text → image
async function searchText(event) {
  event.preventDefault();
  const query = $("#query").value.trim();
  if (!query) return;
  closeItem();
  const request = { query, k: Number($("#k").value), collection: chosen($("#collection")) };
  const response = await withStatus("正在搜索…", () => postJson("/v1/search/text", request));
  if (response) renderResults(response, `“${query}”`);
}

// ---------------------------------------------------------------- image input: drop, paste, pick
function setupDropZone(zone, input, onFile) {
  const accept = (file) => {
    if (!file) return;
    if (!file.type.startsWith("image/")) {
      showError(new ApiError(0, "invalid_image", `${file.name} 不是图片`));
      return;
    }
    const preview = zone.querySelector(".preview");
    if (preview.src) URL.revokeObjectURL(preview.src);
    preview.src = URL.createObjectURL(file);
    preview.hidden = false;
    zone.classList.add("has-image");
    onFile(file);
  };
  zone.addEventListener("click", () => input.click());
  zone.addEventListener("keydown", (e) => {
    if (e.key === "Enter" || e.key === " ") input.click();
  });
  input.addEventListener("change", () => accept(input.files[0]));
  zone.addEventListener("dragover", (e) => {
    e.preventDefault();
    zone.classList.add("dragging");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("dragging"));
  zone.addEventListener("drop", (e) => {
    e.preventDefault();
    zone.classList.remove("dragging");
    accept(e.dataTransfer.files[0]);
  });
  return accept;
}

function currentTab() {
  return document.querySelector('[role="tab"][aria-selected="true"]').dataset.tab;
}

async function searchImage() {
  if (!state.imageFile) return;
  closeItem();
  const target = document.querySelector('input[name="target"]:checked').value;
  const form = new FormData();
  form.append("file", state.imageFile);
  form.append("k", $("#k").value);
  form.append("target", target);
  const collection = chosen(target === "texts" ? $("#text-collection") : $("#collection"));
  if (collection) form.append("collection", collection);
  const response = await withStatus("正在以图搜索…", () => api("/v1/search/image", { method: "POST", body: form }));
  if (response) renderResults(response, target === "texts" ? "匹配的文字" : "相似图片");
}

// ---------------------------------------------------------------- zero-shot classification
function parseLabels() {
  return [...new Set($("#labels").value.split(/[,，\n]/).map((s) => s.trim()).filter(Boolean))];
}

async function classify() {
  if (!state.classifyFile) return;
  const labels = parseLabels();
  const form = new FormData();
  form.append("file", state.classifyFile);
  form.append("labels", JSON.stringify(labels));
  const list = $("#probabilities");
  list.innerHTML = "";
  const ranked = await withStatus("正在分类…", () => api("/v1/classify", { method: "POST", body: form }));
  if (!ranked) return;
  for (const { label, probability } of ranked) {
    const li = document.createElement("li");
    const name = document.createElement("span");
    name.className = "label";
    name.textContent = label;
    const bar = document.createElement("span");
    bar.className = "bar";
    const fill = document.createElement("span");
    fill.style.width = `${(probability * 100).toFixed(1)}%`;
    bar.append(fill);
    const value = document.createElement("span");
    value.className = "value";
    value.textContent = `${(probability * 100).toFixed(1)}%`;
    li.append(name, bar, value);
    list.append(li);
  }
}

async function loadLabelSets() {
  const sets = await api("/v1/label-sets").catch(() => []);
  const select = $("#label-set");
  select.length = 1;
  for (const set of sets) select.append(new Option(`${set.name}（${set.labels.length} 个标签）`, set.name));
  select.labelSets = Object.fromEntries(sets.map((s) => [s.name, s]));
}

async function saveLabelSet() {
  const name = prompt("标签集名称（字母、数字、汉字、_ - .）");
  if (!name) return;
  const saved = await withStatus("正在保存…", () =>
    api(`/v1/label-sets/${encodeURIComponent(name)}`, {
      method: "PUT",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ labels: parseLabels() }),
    }),
  );
  if (saved) await loadLabelSets();
}

// ---------------------------------------------------------------- item page
async function openItem(id) {
  const item = await withStatus("正在加载…", () => api(`/v1/items/${id}`));
  if (!item) return;
  $("#item-image").src = item.image_url;
  $("#item-image").alt = item.caption || "";
  $("#item-caption").textContent = item.caption || "（无描述）";
  $("#item-tags").textContent = item.tags.length ? item.tags.map((t) => `#${t}`).join(" ") : "";
  $("#item-meta").textContent = `${item.width}×${item.height} · ${item.mime || ""} · 集合 ${item.collection}`;
  $("#item-view").hidden = false;
  const similar = await withStatus("正在查找相似图片…", () => api(`/v1/items/${id}/similar?k=${$("#k").value}`));
  if (similar) renderResults(similar, "相似图片");
  window.scrollTo(0, 0);
}

function closeItem() {
  $("#item-view").hidden = true;
}

function route() {
  const match = location.hash.match(/^#\/item\/(\d+)$/);
  if (match) {
    openItem(match[1]);
  } else {
    closeItem();
    if (state.lastSearch) renderResults(...state.lastSearch);
  }
}

// ---------------------------------------------------------------- wiring
function selectTab(tab) {
  for (const button of document.querySelectorAll('[role="tab"]')) {
    const selected = button.dataset.tab === tab;
    button.setAttribute("aria-selected", String(selected));
    $(`#panel-${button.dataset.tab}`).hidden = !selected;
  }
}

function init() {
  for (const button of document.querySelectorAll('[role="tab"]')) {
    button.addEventListener("click", () => selectTab(button.dataset.tab));
  }
  $("#text-form").addEventListener("submit", searchText);

  const acceptSearchImage = setupDropZone($("#image-drop"), $("#image-file"), (file) => {
    state.imageFile = file;
    $("#image-search-button").disabled = false;
    searchImage();
  });
  const acceptClassifyImage = setupDropZone($("#classify-drop"), $("#classify-file"), (file) => {
    state.classifyFile = file;
    $("#classify-button").disabled = false;
    classify();
  });
  $("#image-search-button").addEventListener("click", searchImage);
  $("#classify-button").addEventListener("click", classify);
  for (const radio of document.querySelectorAll('input[name="target"]')) {
    radio.addEventListener("change", () => {
      $("#text-collection").hidden = radio.value !== "texts" || !radio.checked;
      searchImage();
    });
  }
  // Paste an image anywhere: it goes to the image tab that is open (image search by default).
  document.addEventListener("paste", (event) => {
    const file = [...(event.clipboardData?.files || [])].find((f) => f.type.startsWith("image/"));
    if (!file) return;
    event.preventDefault();
    if (currentTab() === "classify") acceptClassifyImage(file);
    else {
      selectTab("image");
      acceptSearchImage(file);
    }
  });

  $("#label-set").addEventListener("change", (event) => {
    const set = event.target.labelSets?.[event.target.value];
    if (set) $("#labels").value = set.labels.join(", ");
  });
  $("#save-label-set").addEventListener("click", saveLabelSet);
  $("#key-button").addEventListener("click", () => {
    const key = prompt("API 密钥（保存在本浏览器中；留空则清除）", localStorage.getItem("cnclip-api-key") || "");
    if (key === null) return;
    if (key) localStorage.setItem("cnclip-api-key", key);
    else localStorage.removeItem("cnclip-api-key");
    loadCollections();
  });
  $("#back").addEventListener("click", () => history.back());
  window.addEventListener("hashchange", route);

  loadCollections();
  loadLabelSets();
  route();
}

init();
