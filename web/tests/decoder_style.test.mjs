// Decoder styles: the two paths must be told apart, and the badge text must stay readable.
import { test } from "node:test";
import assert from "node:assert/strict";
import { BADGE_FG, DECODER_STYLES, contrastRatio, styleForNode } from "../lib/decoder_style.js";

test("each decode node gets its own path's style and the compare node none", () => {
  assert.equal(styleForNode("LTX25ConvVAEDecode"), DECODER_STYLES.conv);
  assert.equal(styleForNode("LTX25DiffusionVAEDecode"), DECODER_STYLES.diffusion);
  assert.equal(styleForNode("LTX25DecoderCompare"), null);
});

test("the two paths differ in colour and in badge text", () => {
  const { conv, diffusion } = DECODER_STYLES;
  for (const key of ["color", "bgcolor", "badge", "badgeBg"]) assert.notEqual(conv[key], diffusion[key], key);
});

test("badge text meets WCAG AA contrast on both badges", () => {
  assert.ok(Math.abs(contrastRatio("#000000", "#ffffff") - 21) < 1e-9, "contrast formula sanity");
  for (const [kind, style] of Object.entries(DECODER_STYLES)) {
    const ratio = contrastRatio(BADGE_FG, style.badgeBg);
    assert.ok(ratio >= 4.5, `${kind} badge contrast ${ratio.toFixed(2)} < 4.5`);
  }
});
