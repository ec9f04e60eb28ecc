package framework

// DecodePlain is decodePlain: Decode's one-pass reader of plain events.
var DecodePlain = decodePlain

// DecodeSDK is decodeSDK: Decode by the CloudEvents SDK, the reference
// that DecodePlain follows.
var DecodeSDK = decodeSDK
