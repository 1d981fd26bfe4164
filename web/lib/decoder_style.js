// How the two decoder paths look on the canvas. Blue and orange stay apart for the common colour-vision
// deficiencies, and the badge spells the path out, so nothing depends on colour alone.

export const DECODER_STYLES = Object.freeze({
  conv: Object.freeze({ color: "#1f4a73", bgcolor: "#22364b", badge: "conv VAE", badgeBg: "#1d5fa3" }),
  diffusion: Object.freeze({ color: "#7a4210", bgcolor: "#4a3322", badge: "diffusion VAE", badgeBg: "#a84d05" }),
});

export const BADGE_FG = "#ffffff";

/** Node class → decoder path; the compare node is not a decoder and gets no style. */
export const DECODER_NODES = Object.freeze({
  LTX25ConvVAEDecode: "conv",
  LTX25DiffusionVAEDecode: "diffusion",
});

/** The style for a node class, or null. */
export function styleForNode(comfyClass) {
  const kind = DECODER_NODES[comfyClass];
  return kind ? DECODER_STYLES[kind] : null;
}

/** WCAG 2 contrast ratio of two "#rrggbb" colours (1 to 21); the tests hold the badges to 4.5 (AA text). */
export function contrastRatio(hexA, hexB) {
  const luminance = (hex) => {
    const [r, g, b] = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16) / 255)
      .map((c) => (c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4));
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const [hi, lo] = [luminance(hexA), luminance(hexB)].sort((x, y) => y - x);
  return (hi + 0.05) / (lo + 0.05);
}
