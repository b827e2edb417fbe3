// The UI's plumbing, loaded before app.js: the API client, error texts in Chinese, and the views
// (a tab panel or the item page) that show status, errors and results. Plain script, no build step.
"use strict";

const $ = (selector, root = document) => root.querySelector(selector);

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
    throw new ApiError(0, "network", "");
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

// ---------------------------------------------------------------- errors, in Chinese
// The API's error `code` → what the user reads. The API's own (English) message stays available
// in the detail line below it. Callers may pass overrides for what a code means in their context.
const ERROR_TEXT = {
  network: "无法连接服务器，请检查网络或服务是否在运行。",
  unauthorized: "需要 API 密钥：点击右上角「API 密钥」填写。",
  forbidden: "没有权限执行此操作。",
  overloaded: "服务繁忙，请稍后重试。",
  payload_too_large: "图片太大，超过了服务器允许的大小。",
  image_too_large: (err) => `图片太大：像素数超过了服务器允许的上限${pixelLimit(err.message)}，请缩小后再试。`,
  invalid_image: "无法识别这张图片，请换一张 JPEG、PNG、WebP、GIF、BMP 或 TIFF 图片。",
  not_an_image: "选择的文件不是图片。",
  invalid_input: "输入不符合要求，请检查后重试。",
  empty_query: "请输入要搜索的文字。",
  no_labels: "请至少输入一个候选标签。",
  not_found: "没有找到请求的内容。",
  conflict: "已经存在同名的内容。",
  encoder_unavailable: "模型正在加载或暂时不可用，请稍后重试。",
  unavailable: "服务暂时不可用，请稍后重试。",
  database_unavailable: "数据库暂时不可用，请稍后重试。",
  model_error: "模型文件有问题，请联系管理员。",
  internal_error: "服务器内部错误，请稍后重试或联系管理员。",
};
const FALLBACK_ERROR_TEXT = "请求失败，请稍后重试。";

function errorText(err, overrides = {}) {
  const text = overrides[err.code] || ERROR_TEXT[err.code] || FALLBACK_ERROR_TEXT;
  return typeof text === "function" ? text(err) : text;
}

// "（上限 80,000,000 像素）" from the API's "…; the limit is 80,000,000 pixels" (or "each side may be at
// most 65,535"), or nothing when the message does not say.
function pixelLimit(message) {
  const area = /limit is ([\d,]+) pixels/.exec(message || "");
  if (area) return `（上限 ${area[1]} 像素）`;
  const side = /each side may be at most ([\d,]+)/.exec(message || "");
  return side ? `（每边最多 ${side[1]} 像素）` : "";
}

// ---------------------------------------------------------------- views
// A tab panel or the item page, each with its own status line, error box and results, so that
// what one view shows never appears under another.
class View {
  constructor(root) {
    this.root = root;
    this.status = $(".status", root);
    this.error = $(".error", root);
    this.title = $(".results-title", root);
    this.results = $(".results", root);
  }

  showStatus(text) {
    this.status.replaceChildren();
    if (text) {
      const spinner = document.createElement("span");
      spinner.className = "spinner";
      this.status.append(spinner, document.createTextNode(text));
    }
    this.status.hidden = !text;
  }

  showError(err, overrides = {}) {
    this.error.hidden = !err;
    if (!err) return;
    $(".error-text", this.error).textContent = errorText(err, overrides);
    const detail = $(".error-detail", this.error);
    detail.textContent = err.message ? `详情：${err.message}${err.status ? `（HTTP ${err.status}，${err.code}）` : ""}` : "";
    detail.hidden = !err.message;
  }

  // Runs `task` with a status line; an error shows in this view's error box (returns undefined).
  async run(text, task, overrides = {}) {
    this.showError(null);
    this.showStatus(text);
    try {
      return await task();
    } catch (err) {
      this.showError(err instanceof ApiError ? err : new ApiError(0, "client", String(err)), overrides);
      return undefined;
    } finally {
      this.showStatus("");
    }
  }

  clearResults() {
    if (this.results) this.results.replaceChildren();
    if (this.title) this.title.hidden = true;
    if (this.more) this.more.remove();
    this.more = null;
  }

  // One page of results. `loadMore(offset)` fetches the next page (a "load more" button while the
  // response says there is one); `append` adds a page under the ones shown.
  renderResults(response, title, loadMore = null, append = false) {
    if (!append) this.clearResults();
    if (this.more) this.more.remove();
    this.more = null;
    this.title.hidden = false;
    const hidden = response.min_score != null && response.below_cutoff
      ? `；已隐藏 ${response.below_cutoff} 条相关度低于 ${response.min_score} 的结果` : "";
    if (!response.results.length && !append) {
      this.title.textContent = hidden ? `${title}：没有足够相关的结果${hidden}` : "";
      const empty = document.createElement("li");
      empty.className = "empty";
      empty.textContent = hidden
        ? "没有相关度达到阈值的结果。可以降低阈值，或取消“只看相关”。"
        : "没有找到结果。换个说法试试，或选择其他集合。";
      this.results.append(empty);
      return;
    }
    for (const result of response.results) this.results.append(resultCard(result));
    const shown = this.results.querySelectorAll(".card").length;
    const total = `${response.total}${response.total_exact ? "" : "+"}`;
    const count = `共 ${total} 条，显示 ${shown} 条（集合 ${response.collection}${hidden}）`;
    this.title.textContent = `${title}：${count} — ${formatTimings(response.timings)}`;
    if (response.has_more && loadMore) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "more";
      button.textContent = "加载更多";
      button.addEventListener("click", () => {
        button.disabled = true;
        loadMore(response.next_offset);
      });
      this.results.after(button);
      this.more = button;
    }
  }
}

const TAKEN_LABEL = { exif: "拍摄于", mtime: "文件日期", upload: "上传于" };

// "拍摄于 2019-05-04" in the browser's time zone; the source says how the date is known.
function takenText(result) {
  if (!result.taken_at) return "";
  const day = new Date(result.taken_at).toLocaleDateString("zh-CN", { year: "numeric", month: "2-digit", day: "2-digit" });
  return `${TAKEN_LABEL[result.taken_at_source] || "日期"} ${day}`;
}

function formatTimings(timings) {
  if (!timings) return "";
  const names = { read: "读取", encode: "编码", search: "检索", db: "数据库", total: "总计" };
  return Object.entries(timings)
    .map(([stage, ms]) => `${names[stage] || stage} ${ms.toFixed(1)} ms`)
    .join(" · ");
}

function textLine(className, text) {
  const span = document.createElement("span");
  span.className = className;
  span.textContent = text;
  return span;
}

// The recognised line holding the match (text in photos), the matched characters in <mark>; a long
// lead-in is cut to its last characters so the mark stays in view (the whole line is the tooltip).
// Built from text nodes only: the text is whatever a photo says, never markup. Offsets count code points.
const MATCH_LEAD = 6;
function matchedLine(match) {
  const line = Array.from(match.line);
  const start = Math.max(0, match.start - match.line_start);
  const end = Math.min(line.length, match.end - match.line_start);
  const lead = start > MATCH_LEAD + 2 ? `…${line.slice(start - MATCH_LEAD, start).join("")}` : line.slice(0, start).join("");
  const span = document.createElement("span");
  span.className = "ocr-match";
  span.title = `图中文字：${match.line}`;
  const mark = document.createElement("mark");
  mark.textContent = line.slice(start, end).join("");
  span.append(document.createTextNode(lead), mark, document.createTextNode(line.slice(end).join("")));
  return span;
}

// The file name when the result has one (images indexed from files), then the caption;
// "（无描述）" when there is neither.
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
    img.alt = result.caption || result.filename || `图片 ${result.id}`;
    if (result.width && result.height) {
      img.width = result.width;
      img.height = result.height;
    }
    link.append(img);
  } else {
    link.addEventListener("click", (e) => e.preventDefault());
  }
  if (result.filename) {
    const name = textLine("filename", result.filename);
    name.title = result.path || result.filename;
    link.append(name);
    if (result.caption) link.append(textLine("caption secondary", result.caption));
  } else {
    link.append(textLine("caption", result.caption || "（无描述）"));
  }
  if (result.matched_text) link.append(matchedLine(result.matched_text));
  link.append(textLine("score", `相似度 ${result.score.toFixed(3)}`));
  const taken = takenText(result);
  if (taken) link.append(textLine("taken", taken));
  li.append(link);
  return li;
}
