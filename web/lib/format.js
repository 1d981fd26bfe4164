// Report formatting for the A/B viewer and the decode-figures panel: plain numbers in, short strings out.
// Pure functions only (no DOM, no ComfyUI), so `node --test` can pin them.

export const DASH = "—";

const isNumber = (x) => typeof x === "number" && Number.isFinite(x);

/** PSNR in dB. The Python report writes identical frames as the string "inf" (JSON has no infinity). */
export function formatPsnr(db) {
  if (db === "inf" || db === Infinity) return "∞ dB (identical)";
  return isNumber(db) ? `${db.toFixed(2)} dB` : DASH;
}

/** SSIM in [0, 1]; four decimals because the interesting differences live in the third. */
export function formatSsim(x) {
  return isNumber(x) ? x.toFixed(4) : DASH;
}

/** Wall time: milliseconds below one second, then seconds with fewer decimals as the number grows. */
export function formatSeconds(s) {
  if (!isNumber(s) || s < 0) return DASH;
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 100) return `${s.toFixed(2)} s`;
  return `${Math.round(s)} s`;
}

const KIB = 1024, MIB = KIB ** 2, GIB = KIB ** 3;

/** Memory in binary units. 0 is what the decoders report on the CPU, where nothing is measured. */
export function formatBytes(bytes) {
  if (!isNumber(bytes) || bytes < 0) return DASH;
  if (bytes === 0) return "0 (not measured)";
  if (bytes < MIB) return `${(bytes / KIB).toFixed(0)} KiB`;
  if (bytes < GIB) return `${(bytes / MIB).toFixed(1)} MiB`;
  return `${(bytes / GIB).toFixed(2)} GiB`;
}

/** The report carries memory as GiB (rounded to 3 decimals); shown through the same units as bytes. */
export function formatGiB(gib) {
  return isNumber(gib) ? formatBytes(gib * GIB) : DASH;
}

/** Tile sizes [[frames, height, width], ...] grouped by size: "4 × 9×256×256". */
export function tileSummary(tileSizes, tileCount) {
  const sizes = Array.isArray(tileSizes) ? tileSizes : [];
  const count = isNumber(tileCount) ? tileCount : sizes.length;
  if (count === 0) return DASH;
  const groups = new Map();
  for (const size of sizes) {
    const key = size.join("×");
    groups.set(key, (groups.get(key) ?? 0) + 1);
  }
  const parts = [...groups].map(([key, n]) => `${n} × ${key}`);
  const noun = count === 1 ? "tile" : "tiles";
  return parts.length ? `${count} ${noun}: ${parts.join(", ")}` : `${count} ${noun}`;
}

/** The decode node's panel: [label, value] rows from one `ltx25_decode_stats` entry. */
export function decodeStatsRows(stats) {
  if (!stats) return [];
  const rows = [
    ["decoder", stats.decoder || DASH],
    ["time", formatSeconds(stats.seconds)],
    ["peak memory", formatBytes(stats.peak_memory_bytes)],
    ["processor", stats.processor || DASH],
  ];
  if (isNumber(stats.steps) && stats.steps > 0) rows.push(["steps", String(stats.steps)]);
  rows.push(["tiles (f×h×w)", tileSummary(stats.tile_sizes, stats.tile_count)]);
  return rows;
}

/**
 * The compare node's table: a header row, then rows of cells. A row of two cells is a figure for the pair
 * (its value spans both decoder columns); a row of three has one value per decoder.
 */
export function reportTable(report, labelA, labelB) {
  const decoders = report?.decoders ?? {};
  const a = decoders[labelA] ?? null, b = decoders[labelB] ?? null;
  const pick = (d, fn) => (d ? fn(d) : DASH);
  const perDecoder = (name, fn) => [name, pick(a, fn), pick(b, fn)];
  return {
    head: ["", labelA, labelB],
    rows: [
      ["PSNR, mean (B vs A)", formatPsnr(report?.psnr_mean_db)],
      ["SSIM, mean (B vs A)", formatSsim(report?.ssim_mean)],
      perDecoder("decoder", (d) => d.decoder || DASH),
      perDecoder("time", (d) => formatSeconds(d.seconds)),
      perDecoder("peak memory", (d) => formatGiB(d.peak_memory_gib)),
      perDecoder("processor", (d) => d.processor || DASH),
      perDecoder("tiles", (d) => tileSummary(d.tile_sizes, d.tiles)),
    ],
  };
}

/**
 * One line under the scrubber: which frame is shown and how far B is from A on it. `sourceIndex` is the video
 * frame (see readAbPayload); when it is unknown only the preview position is given, never another frame's figures.
 */
export function frameCaption(report, shownIndex, shownCount, sourceIndex) {
  if (!Number.isInteger(sourceIndex)) return `preview ${shownIndex + 1} / ${shownCount}`;
  const psnr = report?.psnr_per_frame_db?.[sourceIndex];
  const ssim = report?.ssim_per_frame?.[sourceIndex];
  const total = report?.frames ?? shownCount;
  return `frame ${sourceIndex + 1} / ${total} · PSNR ${formatPsnr(psnr)} · SSIM ${formatSsim(ssim)}`;
}
