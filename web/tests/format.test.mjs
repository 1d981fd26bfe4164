// Report formatting: what a person reads off the A/B table and the decode panel.
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  DASH, decodeStatsRows, formatBytes, formatGiB, formatPsnr, formatSeconds, formatSsim, frameCaption, reportTable,
  tileSummary,
} from "../lib/format.js";

test("psnr 'inf' from the JSON report reads as identical, not NaN", () => {
  // The Python side writes +inf as the string "inf"; treating it as a number would print "NaN dB".
  assert.equal(formatPsnr("inf"), "∞ dB (identical)");
  assert.equal(formatPsnr(Infinity), "∞ dB (identical)");
  assert.equal(formatPsnr(34.217), "34.22 dB");
  assert.equal(formatPsnr(undefined), DASH);
  assert.equal(formatPsnr(NaN), DASH);
});

test("ssim keeps four decimals", () => {
  assert.equal(formatSsim(0.98765), "0.9877");
  assert.equal(formatSsim(1), "1.0000");
  assert.equal(formatSsim(null), DASH);
});

test("seconds switch to milliseconds below one second and drop decimals past 100", () => {
  assert.equal(formatSeconds(0.4123), "412 ms");
  assert.equal(formatSeconds(3.2149), "3.21 s");
  assert.equal(formatSeconds(123.6), "124 s");
  assert.equal(formatSeconds(-1), DASH);
  assert.equal(formatSeconds("3"), DASH);
});

test("memory uses binary units and calls the CPU's zero 'not measured'", () => {
  assert.equal(formatBytes(0), "0 (not measured)");
  assert.equal(formatBytes(512 * 1024), "512 KiB");
  assert.equal(formatBytes(300 * 1024 ** 2), "300.0 MiB");
  assert.equal(formatBytes(3.5 * 1024 ** 3), "3.50 GiB");
  assert.equal(formatGiB(1.25), "1.25 GiB", "the report's GiB must not be read as bytes");
  assert.equal(formatGiB(0.5), "512.0 MiB");
  assert.equal(formatGiB(null), DASH);
});

test("tile summary groups equal tile sizes and counts them", () => {
  const sizes = [[9, 256, 256], [9, 256, 256], [9, 256, 192], [9, 256, 256]];
  assert.equal(tileSummary(sizes, 4), "4 tiles: 3 × 9×256×256, 1 × 9×256×192");
  assert.equal(tileSummary([[9, 64, 64]], 1), "1 tile: 1 × 9×64×64");
  assert.equal(tileSummary([], 0), DASH);
  assert.equal(tileSummary(undefined, 6), "6 tiles", "a count without sizes still shows the count");
});

test("decode panel rows show time, memory, processor and tiles; steps only for the diffusion decoder", () => {
  const conv = { decoder: "conv", seconds: 1.5, peak_memory_bytes: 2 * 1024 ** 3, tile_count: 2,
    tile_sizes: [[9, 64, 64], [9, 64, 64]], processor: "", steps: 0 };
  const rows = Object.fromEntries(decodeStatsRows(conv));
  assert.deepEqual(rows, { decoder: "conv", time: "1.50 s", "peak memory": "2.00 GiB", processor: DASH,
    "tiles (f×h×w)": "2 tiles: 2 × 9×64×64" });
  const diff = Object.fromEntries(decodeStatsRows({ ...conv, decoder: "diffusion", processor: "natten", steps: 4 }));
  assert.equal(diff.processor, "natten");
  assert.equal(diff.steps, "4");
  assert.deepEqual(decodeStatsRows(null), []);
});

const REPORT = {
  frames: 2, size: [64, 48], psnr_mean_db: 31.5, ssim_mean: 0.91,
  psnr_per_frame_db: ["inf", 31.5], ssim_per_frame: [1, 0.82],
  decoders: {
    "conv VAE": { decoder: "conv", seconds: 0.25, peak_memory_gib: 0, processor: "", steps: 0, tiles: 1,
      tile_sizes: [[9, 64, 64]] },
    "diffusion VAE": null,
  },
};

test("report table puts pair figures first and one column per decoder, a missing decoder as dashes", () => {
  const { head, rows } = reportTable(REPORT, "conv VAE", "diffusion VAE");
  assert.deepEqual(head, ["", "conv VAE", "diffusion VAE"]);
  assert.deepEqual(rows[0], ["PSNR, mean (B vs A)", "31.50 dB"]);
  assert.deepEqual(rows[1], ["SSIM, mean (B vs A)", "0.9100"]);
  const byName = Object.fromEntries(rows.slice(2).map(([k, ...v]) => [k, v]));
  assert.deepEqual(byName.time, ["250 ms", DASH]);
  assert.deepEqual(byName["peak memory"], ["0 (not measured)", DASH]);
  assert.deepEqual(byName.decoder, ["conv", DASH]);
  assert.ok(rows.slice(2).every((r) => r.length === 3), "every per-decoder row has one cell per decoder");
});

test("frame caption names the video frame and reads that frame's figures", () => {
  assert.equal(frameCaption(REPORT, 0, 2, 0), "frame 1 / 2 · PSNR ∞ dB (identical) · SSIM 1.0000");
  assert.equal(frameCaption(REPORT, 1, 2, 1), "frame 2 / 2 · PSNR 31.50 dB · SSIM 0.8200");
  // Preview 1 of 2 is video frame 2 of 2: the figures must be frame 2's, not preview position 1's.
  assert.equal(frameCaption(REPORT, 0, 2, 1), "frame 2 / 2 · PSNR 31.50 dB · SSIM 0.8200");
});

test("frame caption without a known video frame gives no figures rather than another frame's", () => {
  assert.equal(frameCaption(REPORT, 3, 24, undefined), "preview 4 / 24");
});
