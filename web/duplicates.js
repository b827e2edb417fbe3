// The duplicates page (#/duplicates): near-duplicate groups of the chosen image collection, by tier,
// the suggested keeper first; select members and delete them (DELETE /v1/items/{id}: remembered, the
// files on disk are never touched). Loaded after views.js and before app.js, which calls
// setupDuplicates() and openDuplicates(). No inline scripts or handlers (CSP).
"use strict";

const DUP_PAGE = 10; // groups per page
const TIER_LABEL = {
  identical: "相同文件",
  resized: "同一张图（重新编码或缩放）",
  similar: "相似照片",
};
const TIER_HINT = {
  identical: "这些文件的字节完全相同，图库中只保存一份；删除它会同时忘记所有副本。",
  resized: "同一张图片被重新压缩、缩放或另存为其他格式。",
  similar: "很可能是连拍或同一场景的不同照片，请确认后再删除。",
};
const dup = { view: null, collection: null, offset: 0, pickCollection: null, loading: 0 };

function setupDuplicates(view, pickCollection) {
  dup.view = view;
  dup.pickCollection = pickCollection;
  const root = view.root;
  $("#dup-find").addEventListener("click", () => loadDuplicates(0));
  $("#dup-tier").addEventListener("change", () => loadDuplicates(0));
  $(".dup-continue", root).addEventListener("click", () => loadDuplicates(dup.offset));
  $(".dup-prev", root).addEventListener("click", () => loadDuplicates(Math.max(0, dup.offset - DUP_PAGE)));
  $(".dup-next", root).addEventListener("click", () => loadDuplicates(dup.offset + DUP_PAGE));
  $("#dup-back").addEventListener("click", () => {
    location.hash = "#/";
  });
  $("#collection").addEventListener("change", () => {
    if (!root.hidden) loadDuplicates(0);
  });
}

// Opening the page shows the page it showed last (back from an item page), else the first one.
async function openDuplicates() {
  const collection = await dup.pickCollection();
  await loadDuplicates(collection === dup.collection ? dup.offset : 0);
}

async function loadDuplicates(offset) {
  const view = dup.view;
  const root = view.root;
  const collection = await dup.pickCollection();
  const ticket = ++dup.loading; // a slower earlier answer never overwrites a later one
  dup.collection = collection;
  dup.offset = offset;
  if (!collection) {
    clearDuplicates();
    view.showError(new ApiError(0, "no_collection", ""), { no_collection: "还没有图片集合。" });
    return;
  }
  const params = new URLSearchParams({ tier: $("#dup-tier").value, limit: String(DUP_PAGE), offset: String(offset) });
  const body = await view.run(
    "正在查找重复照片…（图片很多时需要一些时间）",
    () => api(`/v1/collections/${encodeURIComponent(collection)}/duplicates?${params}`),
    { overloaded: "另一个重复查找正在进行，请稍后重试。", invalid_input: "这个集合不能查找重复照片（只支持图片集合）。" },
  );
  if (ticket !== dup.loading) return;
  clearDuplicates();
  if (body) renderDuplicates(body);
}

function clearDuplicates() {
  const root = dup.view.root;
  $(".dup-groups", root).replaceChildren();
  for (const selector of [".results-title", ".dup-partial", ".dup-unhashed", ".dup-pager"]) $(selector, root).hidden = true;
}

function renderDuplicates(body) {
  const root = dup.view.root;
  const title = $(".results-title", root);
  const counts = `相同文件 ${body.counts.identical} · 同一张图 ${body.counts.resized} · 相似照片 ${body.counts.similar}`;
  let threshold = body.similar_threshold_source === "unmeasured" ? "（此模型的相似阈值未经实测）" : "";
  if (body.similar_threshold === null) threshold = "（相似照片已关闭：当前模型在这个集合上分不清同一场景的另一张与不同的照片）";
  const byDefault = ["measured", "unmeasured"].includes(body.similar_threshold_source);
  if (byDefault && body.calibration && body.calibration.reason_code === "too_few") threshold = "（照片太少，相似阈值暂用模型的默认值）";
  title.textContent = `集合 ${body.collection}：共 ${body.total} 组（${counts}）${threshold}`;
  title.hidden = false;
  if (!body.complete) {
    $(".dup-partial-text", root).textContent =
      `相似照片尚未查完：已检查 ${body.examined} / ${body.searchable} 张，结果可能还会增加。`;
    $(".dup-partial", root).hidden = false;
  }
  if (body.unhashed) {
    $(".dup-unhashed", root).textContent =
      `有 ${body.unhashed} 张图片还没有感知哈希，暂时无法判断是否为同一张图：重新运行 cnclip index 对应的文件夹即可补上。`;
    $(".dup-unhashed", root).hidden = false;
  }
  const list = $(".dup-groups", root);
  if (!body.groups.length) {
    const empty = document.createElement("li");
    empty.className = "empty";
    empty.textContent = body.total ? "这一页没有分组了。" : "没有找到重复或相似的照片。";
    list.append(empty);
  }
  body.groups.forEach((group, i) => list.append(groupCard(group, body.offset + i + 1)));
  const pages = Math.max(1, Math.ceil(body.total / DUP_PAGE));
  $(".dup-page", root).textContent = `第 ${Math.floor(body.offset / DUP_PAGE) + 1} / ${pages} 页`;
  $(".dup-prev", root).disabled = body.offset === 0;
  $(".dup-next", root).disabled = !body.has_more;
  $(".dup-pager", root).hidden = body.total <= DUP_PAGE && body.offset === 0;
}

// indexer/service/keeper.py's reason codes: why the first member is the one to keep.
const KEEPER_REASON = {
  more_detail: "细节最多（不是放大的副本，也不是缩小的副本）",
  not_upscaled: "没有被放大",
  lossless: "无损格式，其余是有损重新压缩",
  higher_quality: "JPEG 质量更高",
  more_metadata: "元数据更完整（拍摄日期、GPS、相机）",
  more_bytes: "文件更大",
  oldest: "最早收录",
  same_bytes: "字节完全相同，保留条目本身",
};

function groupCard(group, number) {
  const li = document.createElement("li");
  li.className = "dup-group";
  li.dataset.tier = group.tier;
  li.dataset.keeper = group.keeper;
  const head = document.createElement("div");
  head.className = "dup-head";
  head.append(textLine("dup-tier", `${number}. ${TIER_LABEL[group.tier]}（${group.members.length} 张）`));
  head.append(textLine("dup-hint", TIER_HINT[group.tier]));
  if (group.keeper_reason) {
    const reason = textLine("dup-keeper-reason", `建议保留：${KEEPER_REASON[group.keeper_reason.code] || ""}（${group.keeper_reason.text}）`);
    reason.dataset.code = group.keeper_reason.code;
    head.append(reason);
  }
  const members = document.createElement("ul");
  members.className = "dup-members";
  for (const member of group.members) members.append(memberCard(member));
  const remove = document.createElement("button");
  remove.type = "button";
  remove.className = "dup-delete";
  remove.disabled = true;
  remove.textContent = "删除所选";
  li.addEventListener("change", () => {
    const chosen = selectedIds(li);
    remove.disabled = !chosen.length;
    remove.textContent = chosen.length ? `删除所选（${chosen.length} 张）` : "删除所选";
  });
  remove.addEventListener("click", () => deleteSelected(li, group));
  li.append(head, members, remove);
  return li;
}

function memberCard(member) {
  const li = document.createElement("li");
  li.className = member.keeper ? "dup-member keeper" : "dup-member";
  li.dataset.id = member.id;
  const link = document.createElement("a");
  link.href = `#/item/${member.id}`;
  const img = document.createElement("img");
  img.loading = "lazy";
  img.src = member.thumbnail_url;
  img.alt = member.filename || member.caption || `图片 ${member.id}`;
  link.append(img);
  li.append(link);
  if (member.keeper) li.append(textLine("badge keep", "建议保留"));
  if (member.copy_of_item) li.append(textLine("badge copy", "副本文件"));
  const name = textLine("filename", member.path || member.filename || member.caption || `图片 ${member.id}`);
  name.title = name.textContent;
  li.append(name);
  const facts = [];
  if (member.copy_of_item) facts.push("字节完全相同");
  else if (!member.keeper) facts.push(`相似度 ${member.score.toFixed(3)}`);
  if (!member.keeper && !member.copy_of_item && member.hamming != null) facts.push(`哈希差 ${member.hamming} 位`);
  if (member.width && member.height) facts.push(`${member.width}×${member.height}`);
  if (member.size) facts.push(formatBytes(member.size));
  li.append(textLine("dup-facts", facts.join(" · ")));
  const taken = takenText(member);
  if (taken) li.append(textLine("taken", taken));
  if (!member.copy_of_item) {
    const label = document.createElement("label");
    label.className = "dup-pick";
    const box = document.createElement("input");
    box.type = "checkbox";
    box.value = member.id;
    label.append(box, document.createTextNode(" 选择"));
    li.append(label);
  }
  return li;
}

function selectedIds(groupElement) {
  return [...groupElement.querySelectorAll('.dup-pick input:checked')].map((box) => box.value);
}

function formatBytes(size) {
  if (size >= 1e6) return `${(size / 1e6).toFixed(1)} MB`;
  if (size >= 1e3) return `${Math.round(size / 1e3)} KB`;
  return `${size} B`;
}

async function deleteSelected(groupElement, group) {
  const ids = selectedIds(groupElement);
  if (!ids.length) return;
  const all = ids.length === new Set(group.members.filter((m) => !m.copy_of_item).map((m) => m.id)).size;
  const warning = all ? "\n注意：这会删除这一组的全部图片。" : "";
  if (!confirm(`从图库中删除 ${ids.length} 张图片？删除会被记住，重新索引也不会加回；磁盘上的文件不会被删除。${warning}`)) return;
  const done = await dup.view.run("正在删除…", async () => {
    for (const id of ids) await api(`/v1/items/${id}`, { method: "DELETE" });
    return true;
  });
  if (done) await loadDuplicates(dup.offset);
}
