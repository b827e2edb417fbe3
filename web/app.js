// The search UI: plain JavaScript, no build step. Talks only to the /v1 REST API; the API client,
// error texts and views are in views.js (loaded first). No inline scripts or handlers anywhere:
// the pages are served under a script-src 'self' Content-Security-Policy.
"use strict";

const state = { imageFile: null, classifyFile: null, itemId: null, suggested: {} };
const views = {};

// ---------------------------------------------------------------- collections
async function loadCollections() {
  const collections = await views.text.run("正在加载集合…", () => api("/v1/collections"));
  if (!collections) return;
  state.collections = {};
  for (const c of collections) {
    state.suggested[c.name] = c.suggested_min_score || {};
    state.collections[c.name] = c;
  }
  fillSelect($("#collection"), collections.filter((c) => c.kind === "images"), "还没有图片集合");
  suggestCutoff();
  showMigration();
  fillSelect($("#text-collection"), collections.filter((c) => c.kind === "texts"), "还没有文字集合");
}

function fillSelect(select, collections, emptyText) {
  select.replaceChildren();
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

// A migration to another model in progress: searches keep using the active model until the swap.
function showMigration() {
  const migration = state.collections?.[$("#collection").value]?.migration;
  const note = $("#migration-note");
  note.hidden = !migration;
  if (!migration) return;
  const percent = Math.floor(migration.coverage * 100);
  note.textContent = `该集合正在迁移到新模型 ${migration.to_model}（已完成 ${percent}%），搜索暂时仍使用当前模型。`;
}

// The cutoff the server suggests for the chosen collection's model (text → image scores).
// A model without a suggestion starts with every result shown (its scores are not known here).
function suggestCutoff() {
  const suggested = state.suggested[$("#collection").value]?.text;
  $("#min-score").value = suggested != null ? String(suggested) : "";
  $("#cutoff").checked = suggested != null;
  $("#min-score").disabled = suggested == null;
}

// sort and min_score for a search; image → image uses the model's image cutoff (its scores run higher).
function pageOptions(kind, collection) {
  const options = { sort: $("#sort").value };
  if ($("#cutoff").checked) {
    const typed = Number($("#min-score").value);
    const value = kind === "text" ? typed : state.suggested[collection]?.image;
    if ($("#min-score").value !== "" && Number.isFinite(value) && value >= -1 && value <= 1) options.min_score = value;
  }
  return options;
}

// The "不要…" field: texts the results should not show, split at commas (, ， 、 ；), each once.
function excludedTexts(field) {
  return [...new Set(field.value.split(/[,，、;；]/).map((s) => s.trim()).filter(Boolean))];
}

// ---------------------------------------------------------------- text → image
async function searchText(event) {
  event.preventDefault();
  const view = views.text;
  const query = $("#query").value.trim();
  if (!query) {
    view.clearResults();
    view.showError(new ApiError(0, "empty_query", ""));
    $("#query").focus();
    return;
  }
  const collection = chosen($("#collection"));
  const request = { query, k: Number($("#k").value), collection, ...pageOptions("text", collection) };
  const exclude = excludedTexts($("#exclude"));
  if (exclude.length) request.exclude = exclude;
  const page = async (offset) => {
    const response = await view.run("正在搜索…", () => postJson("/v1/search/text", { ...request, offset }));
    if (response) view.renderResults(response, title, page, offset > 0);
  };
  const title = `“${query}”` + (exclude.length ? `，不要${exclude.map((t) => `“${t}”`).join("、")}` : "");
  await page(0);
}

// ---------------------------------------------------------------- image input: drop, paste, pick
// What an <img> shows in every current browser (indexer/domain/renditions.py BROWSER_MIMES).
const BROWSER_MIMES = new Set(["image/jpeg", "image/png", "image/webp", "image/gif", "image/avif", "image/bmp"]);
// Photos a browser may not label "image/…" (a camera RAW, HEIC on some systems): accepted by name.
const PHOTO_NAMES = /\.(tiff?|heic|heif|hif|avif|dng|cr2|cr3|nef|arw|raf|orf|rw2)$/i;

// Choosing an image only shows it; the caller decides what runs next.
function setupDropZone(zone, input, view, onFile) {
  const preview = $(".preview", zone);
  const fileName = $(".file-name", zone);
  preview.addEventListener("error", () => {
    preview.hidden = true; // a format the browser cannot show (TIFF, HEIC, RAW): the file name says what was chosen
  });
  const accept = (file) => {
    if (!file) return;
    if (!file.type.startsWith("image/") && !PHOTO_NAMES.test(file.name)) {
      view.showError(new ApiError(0, "not_an_image", file.name));
      return;
    }
    view.showError(null);
    if (preview.src) URL.revokeObjectURL(preview.src);
    preview.src = URL.createObjectURL(file);
    preview.hidden = false;
    fileName.textContent = `已选择：${file.name}`;
    fileName.hidden = false;
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
  const view = views.image;
  const target = document.querySelector('input[name="target"]:checked').value;
  const form = new FormData();
  form.append("file", state.imageFile);
  form.append("k", $("#k").value);
  form.append("target", target);
  const collection = chosen(target === "texts" ? $("#text-collection") : $("#collection"));
  if (collection) form.append("collection", collection);
  // Image → text scores are text-image cosines: the text cutoff; image → image: the image one.
  const options = target === "texts" ? { sort: "relevance" } : pageOptions("image", $("#collection").value);
  for (const [name, value] of Object.entries(options)) form.append(name, String(value));
  for (const text of excludedTexts($("#image-exclude"))) form.append("exclude", text);
  const title = target === "texts" ? "匹配的文字" : "相似图片";
  const page = async (offset) => {
    form.set("offset", String(offset));
    const response = await view.run("正在以图搜索…", () => api("/v1/search/image", { method: "POST", body: form }));
    if (response) view.renderResults(response, title, page, offset > 0);
    else if (!offset) view.clearResults();
  };
  await page(0);
}

// ---------------------------------------------------------------- zero-shot classification
function parseLabels() {
  return [...new Set($("#labels").value.split(/[,，\n]/).map((s) => s.trim()).filter(Boolean))];
}

async function classify() {
  const view = views.classify;
  const list = $("#probabilities");
  list.replaceChildren();
  list.hidden = true;
  const labels = parseLabels();
  if (!labels.length) {
    view.showError(new ApiError(0, "no_labels", ""));
    return;
  }
  const form = new FormData();
  form.append("file", state.classifyFile);
  form.append("labels", JSON.stringify(labels));
  const ranked = await view.run("正在分类…", () => api("/v1/classify", { method: "POST", body: form }));
  if (!ranked) return;
  for (const { label, probability } of ranked) {
    const li = document.createElement("li");
    const bar = document.createElement("span");
    bar.className = "bar";
    const fill = document.createElement("span");
    fill.style.width = `${(probability * 100).toFixed(1)}%`; // CSSOM, not a style attribute: CSP-safe
    bar.append(fill);
    li.append(textLine("label", label), bar, textLine("value", `${(probability * 100).toFixed(1)}%`));
    list.append(li);
  }
  list.hidden = false;
}

async function loadLabelSets() {
  const sets = await api("/v1/label-sets").catch(() => []);
  const select = $("#label-set");
  select.length = 1;
  for (const set of sets) select.append(new Option(`${set.name}（${set.labels.length} 个标签）`, set.name));
  select.labelSets = Object.fromEntries(sets.map((s) => [s.name, s]));
}

async function saveLabelSet() {
  const view = views.classify;
  const labels = parseLabels();
  if (!labels.length) {
    view.showError(new ApiError(0, "no_labels", ""));
    return;
  }
  const name = prompt("标签集名称（字母、数字、汉字、_ - .）");
  if (!name) return;
  const saved = await view.run(
    "正在保存…",
    () =>
      api(`/v1/label-sets/${encodeURIComponent(name)}`, {
        method: "PUT",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ labels }),
      }),
    { invalid_input: "标签集名称只能包含字母、数字、汉字和 _ - .，最多 64 个字符；标签每个最多 100 个字符。" },
  );
  if (saved !== undefined) await loadLabelSets();
}

// ---------------------------------------------------------------- item page
async function openItem(id) {
  const view = views.item;
  state.itemId = id;
  showPage("item");
  view.clearResults();
  $("#item-image").removeAttribute("src");
  for (const el of ["#item-caption", "#item-file", "#item-tags", "#item-meta", "#item-ocr-text"]) $(el).textContent = "";
  $("#item-ocr").hidden = true;
  const item = await view.run("正在加载…", () => api(`/v1/items/${id}`), {
    not_found: "没有找到这张图片，它可能已被删除。",
  });
  if (!item || state.itemId !== id) return;
  // HEIC, TIFF and camera RAW: the server's JPEG rendition (the original stays at image_url).
  $("#item-image").src = BROWSER_MIMES.has(item.mime) ? item.image_url : `${item.image_url}?format=jpeg`;
  $("#item-image").alt = item.caption || item.filename || "";
  $("#item-caption").textContent = item.caption || item.filename || "（无描述）";
  $("#item-file").textContent = item.filename ? `文件：${item.path || item.filename}` : "";
  $("#item-file").hidden = !item.filename;
  $("#item-tags").textContent = item.tags.length ? item.tags.map((t) => `#${t}`).join(" ") : "";
  const taken = takenText(item);
  $("#item-meta").textContent =
    `${item.width}×${item.height} · ${item.mime || ""} · 集合 ${item.collection}${taken ? ` · ${taken}` : ""}`;
  // The text recognised in the photo (collections with ocr), as text: a photo can say anything.
  $("#item-ocr-text").textContent = item.ocr_text || "";
  $("#item-ocr").hidden = !item.ocr_text;
  window.scrollTo(0, 0);
  const params = new URLSearchParams({ k: $("#k").value, ...pageOptions("image", item.collection) });
  const page = async (offset) => {
    params.set("offset", String(offset));
    const similar = await view.run("正在查找相似图片…", () => api(`/v1/items/${id}/similar?${params}`));
    if (similar && state.itemId === id) view.renderResults(similar, "相似图片", page, offset > 0);
  };
  await page(0);
}

// A page (the item page, the duplicates page) replaces the tabs while it is open; the tabs keep
// their results underneath. `page` is "item", "duplicates" or null (the tabs).
function showPage(page) {
  views.item.root.hidden = page !== "item";
  views.duplicates.root.hidden = page !== "duplicates";
  $("#tabs").hidden = page !== null;
  for (const tab of ["text", "image", "classify"]) views[tab].root.hidden = page !== null || tab !== currentTab();
  if (page !== "item") state.itemId = null;
}

function route() {
  const match = location.hash.match(/^#\/item\/(\d+)$/);
  if (match) openItem(match[1]);
  else if (location.hash === "#/duplicates") {
    showPage("duplicates");
    openDuplicates();
  } else showPage(null);
}

// ---------------------------------------------------------------- wiring
function selectTab(tab) {
  for (const button of document.querySelectorAll('[role="tab"]')) {
    const selected = button.dataset.tab === tab;
    button.setAttribute("aria-selected", String(selected));
    views[button.dataset.tab].root.hidden = !selected;
  }
}

function init() {
  for (const name of ["text", "image", "classify"]) views[name] = new View($(`#panel-${name}`));
  views.item = new View($("#item-view"));
  views.duplicates = new View($("#duplicates-view"));
  // The duplicates page looks at the chosen image collection, once the list has loaded.
  setupDuplicates(views.duplicates, async () => {
    await state.collectionsLoaded;
    return chosen($("#collection"));
  });

  for (const button of document.querySelectorAll('[role="tab"]')) {
    button.addEventListener("click", () => selectTab(button.dataset.tab));
  }
  $("#text-form").addEventListener("submit", searchText);
  $("#collection").addEventListener("change", () => {
    suggestCutoff();
    showMigration();
  });
  $("#cutoff").addEventListener("change", () => {
    $("#min-score").disabled = !$("#cutoff").checked;
    if ($("#cutoff").checked && $("#min-score").value === "") $("#min-score").value = "0.2";
  });

  // Image search runs as soon as an image is chosen (as image search engines do); classification
  // waits for the button, since the labels usually need editing first.
  const acceptSearchImage = setupDropZone($("#image-drop"), $("#image-file"), views.image, (file) => {
    state.imageFile = file;
    $("#image-search-button").disabled = false;
    searchImage();
  });
  const acceptClassifyImage = setupDropZone($("#classify-drop"), $("#classify-file"), views.classify, (file) => {
    state.classifyFile = file;
    $("#classify-button").disabled = false;
    $("#probabilities").replaceChildren(); // the bars belonged to the previous image
    $("#probabilities").hidden = true;
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
    const pasted = [...(event.clipboardData?.files || [])];
    const file = pasted.find((f) => f.type.startsWith("image/") || PHOTO_NAMES.test(f.name));
    if (!file) return;
    event.preventDefault();
    if (state.itemId || !views.duplicates.root.hidden) location.hash = "#/"; // leave the page for the tab
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
  $("#back").addEventListener("click", () => {
    if (history.length > 1) history.back();
    else location.hash = "#/";
  });
  window.addEventListener("hashchange", route);

  state.collectionsLoaded = loadCollections();
  loadLabelSets();
  route();
}

init();
